"""verl agent-loop batch and AgentLoopOutput records, checked against verl's field contract.

The contract (verl 0.9.1 `experimental/agent_loop/agent_loop.py`): prompts left-padded, responses
right-padded, `position_ids = clip(cumsum(attention_mask) - 1, 0)`, `response_mask` 1 on sampled
tokens only, `rollout_log_probs` 0.0 elsewhere, `rm_scores` = reward at the last valid response
token, `uid` = GRPO group. `test_convert_verl_real.py` runs verl's own post-processing when verl is
installed; here the contract is checked position by position.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.convert_samples import merged_sample, single_sample
from tito_agents import ConfigurationError
from tito_agents.convert import ConversionError, to_agent_loop_outputs, to_verl_batch
from tito_agents.samples import trajectory_id_for

MERGED_RESPONSE = [201, 202, 301, 302, 303, 203, 204, 205, 304, 206]
MERGED_RESPONSE_MASK = [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]


def test_verl_batch_places_every_token_mask_bit_logprob_and_reward() -> None:
    """A 3-call merged sample and a per-call sample land exactly where verl's agent loop puts them."""
    samples = [merged_sample(reward=1.0), single_sample(reward=0.25, group_id="h")]
    batch = to_verl_batch(samples, pad_id=0)
    assert batch.prompts.tolist() == [[101, 102, 103, 104], [0, 0, 111, 112]]
    assert batch.responses.tolist() == [MERGED_RESPONSE, [211, 212, 213, 214] + [0] * 6]
    assert batch.response_mask.tolist() == [MERGED_RESPONSE_MASK, [1, 1, 1, 1] + [0] * 6]
    assert batch.input_ids.tolist() == [
        [101, 102, 103, 104, *MERGED_RESPONSE],
        [0, 0, 111, 112, 211, 212, 213, 214] + [0] * 6,
    ]
    assert batch.attention_mask.tolist() == [[1] * 14, [0, 0] + [1] * 6 + [0] * 6]
    assert batch.position_ids.tolist() == [
        list(range(14)),
        [0, 0, 0, 1, 2, 3, 4, 5] + [5] * 6,
    ]
    assert batch.rollout_log_probs is not None
    expected_lp = [
        [
            -t / 1000 if m else 0.0
            for t, m in zip(MERGED_RESPONSE, MERGED_RESPONSE_MASK, strict=True)
        ],
        [-0.211, -0.212, -0.213, -0.214] + [0.0] * 6,
    ]
    np.testing.assert_allclose(batch.rollout_log_probs, expected_lp, rtol=1e-6)
    assert batch.rm_scores is not None
    assert batch.rm_scores.tolist() == [[0.0] * 9 + [1.0], [0.0, 0.0, 0.0, 0.25] + [0.0] * 6]
    assert batch.uid.tolist() == ["g", "h"]
    assert batch.num_turns.tolist() == [3, 1]


def test_verl_fixed_lengths_pad_to_the_rollout_config() -> None:
    """`prompt_length` / `response_length` fix the widths like verl's rollout config."""
    batch = to_verl_batch([single_sample()], prompt_length=5, response_length=7, pad_id=2)
    assert batch.prompts.tolist() == [[2, 2, 2, 111, 112]]
    assert batch.responses.tolist() == [[211, 212, 213, 214, 2, 2, 2]]
    assert batch.rm_scores is not None and batch.rm_scores.tolist() == [[0, 0, 0, 1.0, 0, 0, 0]]
    with pytest.raises(ConversionError, match="do not fit"):
        to_verl_batch([merged_sample()], prompt_length=4, response_length=5)
    cut = to_verl_batch([merged_sample()], prompt_length=4, response_length=5, overflow="truncate")
    assert cut.responses.tolist() == [MERGED_RESPONSE[:5]]
    assert cut.rm_scores is not None and cut.rm_scores.tolist() == [[0, 0, 0, 0, 1.0]]


def test_verl_optional_fields_need_every_sample() -> None:
    """`rm_scores` / `rollout_log_probs` exist only when every sample has a reward / logprobs."""
    batch = to_verl_batch([merged_sample(reward=None), single_sample(with_logprobs=False)])
    assert batch.rm_scores is None and batch.rollout_log_probs is None
    assert set(batch.tensors()) == {
        "prompts",
        "responses",
        "response_mask",
        "input_ids",
        "attention_mask",
        "position_ids",
    }


def test_verl_tensors_have_verl_dtypes_and_non_tensors_carry_uid() -> None:
    """`to_torch()` gives int64 ids/masks/positions and float32 scores; uid and provenance are
    numpy object arrays for `non_tensor_batch`."""
    batch = to_verl_batch([merged_sample(), single_sample(group_id=None, task_id="t7")])
    tensors = batch.to_torch()
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask"):
        assert tensors[key].dtype == torch.int64
    assert tensors["rollout_log_probs"].dtype == torch.float32
    assert tensors["rm_scores"].dtype == torch.float32
    non_tensors = batch.non_tensors()
    assert non_tensors["uid"].dtype == object and non_tensors["uid"].tolist() == ["g", "t7"]
    assert non_tensors["sample_id"].tolist() == ["merged", "single"]
    assert non_tensors["__num_turns__"].tolist() == [3, 1]


def test_to_data_proto_without_verl_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without verl importable, `to_data_proto` raises ConfigurationError with an install hint."""
    real_import = importlib.import_module

    def no_verl(name: str, package: str | None = None) -> Any:
        if name.startswith("verl"):
            raise ImportError(name)
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", no_verl)
    with pytest.raises(ConfigurationError, match="pip install verl"):
        to_verl_batch([single_sample()]).to_data_proto()


def test_agent_loop_outputs_are_unpadded_lists_split_at_the_first_sampled_token() -> None:
    """Each record holds AgentLoopOutput's fields: prompt / response ids, mask and logprobs as lists."""
    (merged, single) = to_agent_loop_outputs([merged_sample(reward=0.5), single_sample()])
    assert merged["prompt_ids"] == [101, 102, 103, 104]
    assert merged["response_ids"] == MERGED_RESPONSE
    assert merged["response_mask"] == MERGED_RESPONSE_MASK
    assert merged["response_logprobs"] == pytest.approx(
        [
            -t / 1000 if m else 0.0
            for t, m in zip(MERGED_RESPONSE, MERGED_RESPONSE_MASK, strict=True)
        ]
    )
    assert merged["reward_score"] == 0.5
    assert merged["num_turns"] == 3
    assert merged["extra_fields"] == {
        "sample_id": "merged",
        "episode_id": "ep-merged",
        "uid": "g",
        "trajectory_id": trajectory_id_for("ep-merged", "main"),  # from its episode and agent
        "segment_index": None,
        "prev_sample_id": None,
        "rewrite": None,
        "is_summary": False,
    }
    assert single["prompt_ids"] == [111, 112] and single["response_mask"] == [1, 1, 1, 1]
    assert all(type(v) is int for v in merged["response_ids"])
    no_lp = to_agent_loop_outputs([single_sample(with_logprobs=False)])[0]
    assert no_lp["response_logprobs"] is None
