"""The verl converter against verl's own code: its agent-loop post-processing and GRPO advantage.

verl is not a dependency of this project (it pins transformers < 5.11 and pulls ray); these tests
run where it is importable and skip, saying so, where it is not.
"""

from __future__ import annotations

import asyncio
import types
from typing import Any

import numpy as np
import pytest
import torch

agent_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed (optional; pip install verl to run these checks)",
)
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")

from tests.support.convert_samples import build_sample, merged_sample, single_sample  # noqa: E402
from tito_agents.convert import group_advantages, to_agent_loop_outputs, to_verl_batch  # noqa: E402
from tito_agents.testing.smollm2 import load_tokenizer  # noqa: E402

PROMPT_LENGTH, RESPONSE_LENGTH = 6, 12


def verl_worker() -> Any:
    """An `AgentLoopWorker` with only what its post-processing reads (no Ray, no servers)."""
    worker = object.__new__(agent_loop.AgentLoopWorker)
    worker.tokenizer = load_tokenizer()
    worker.processor = None
    worker.rollout_config = types.SimpleNamespace(
        prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH
    )
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = None
    return worker


def test_verl_postprocess_of_our_records_equals_our_batch() -> None:
    """verl's `_agent_loop_postprocess` + `_postprocess` of `to_agent_loop_outputs` records give
    the same tensors, field for field, as `to_verl_batch`."""
    samples = [merged_sample(reward=1.0), single_sample(reward=0.25, group_id="h")]
    worker = verl_worker()

    async def postprocess() -> list[Any]:
        return [
            await worker._agent_loop_postprocess(
                agent_loop.AgentLoopOutput(**record), validate=False, raw_prompt=[]
            )
            for record in to_agent_loop_outputs(samples)
        ]

    data = worker._postprocess(asyncio.run(postprocess()))
    ours = to_verl_batch(
        samples,
        pad_id=worker.tokenizer.pad_token_id,
        prompt_length=PROMPT_LENGTH,
        response_length=RESPONSE_LENGTH,
    ).to_torch()
    assert set(data.batch.keys()) == set(ours)
    for key, tensor in data.batch.items():
        assert ours[key].dtype == tensor.dtype, key
        assert torch.equal(ours[key], tensor), key
    assert data.non_tensor_batch["uid"].tolist() == ["g", "h"]


def test_to_data_proto_builds_a_verl_data_proto() -> None:
    """`VerlBatch.to_data_proto()` is a real DataProto holding our tensors and non-tensors."""
    batch = to_verl_batch([merged_sample(), single_sample()])
    proto = batch.to_data_proto(meta_info={"step": 3})
    assert len(proto) == 2
    assert torch.equal(proto.batch["response_mask"], batch.to_torch()["response_mask"])
    assert proto.non_tensor_batch["uid"].tolist() == ["g", "g"]
    assert proto.meta_info == {"step": 3}


def test_group_advantages_match_verl_grpo() -> None:
    """`group_advantages` equals verl's `compute_grpo_outcome_advantage` on our rm_scores and uid."""
    rewards = [("a", 1.0), ("a", 0.0), ("b", 2.0), ("a", 1.0), ("c", 0.5), ("c", 0.5), ("a", 0.3)]
    samples = [
        build_sample([("ctx", [1, 2]), ("gen", [3, 4, 5])], sample_id=f"s{i}", group_id=g, reward=r)
        for i, (g, r) in enumerate(rewards)
    ]
    batch = to_verl_batch(samples).to_torch()
    for normalize in (True, False):
        verl_adv, _ = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=batch["rm_scores"],
            response_mask=batch["response_mask"],
            index=to_verl_batch(samples).uid,
            norm_adv_by_std_in_grpo=normalize,
        )
        ours = group_advantages(samples, normalize_std=normalize)
        np.testing.assert_allclose(verl_adv[:, 0].numpy(), ours, rtol=1e-5, atol=1e-6)
