"""The TRL converters against TRL's own trainer code (TRL 1.16): GRPOTrainer consuming our
`rollout_func` values, and AsyncGRPO's queue dataset + packer consuming our `RolloutSample`s.

The model is a tiny randomly initialised Llama on the SmolLM2 tokenizer (no download); the point is
what TRL builds from our values, not what it learns.
"""

from __future__ import annotations

import os
import queue
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns on every experimental import
trl = pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

from tests.support.convert_samples import merged_sample, single_sample  # noqa: E402
from tests.support.trl_trainer import grpo_trainer  # noqa: E402
from tito_agents import Sample  # noqa: E402
from tito_agents.convert import (  # noqa: E402
    pack_batch,
    pad_split_batch,
    to_trl_rollout,
    to_trl_rollout_samples,
)
from tito_agents.testing.smollm2 import load_tokenizer  # noqa: E402

# transformers 5 deprecates a TrainingArguments field that TRL's GRPOConfig still sets.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is deprecated and will be removed in v6:FutureWarning"
)

MERGED_ENV_MASK = [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer()


def group_of_two() -> list[Sample]:
    return [merged_sample(reward=1.0, episode_id="a"), single_sample(reward=0.0, episode_id="b")]


def test_grpo_trainer_pads_our_rollout_exactly_like_our_split_batch(
    tokenizer: Any, tmp_path: Path
) -> None:
    """GRPOTrainer turns our rollout_func values into the same prompt / completion tensors as
    `pad_split_batch`, with loss mask (completion_mask * tool_mask) = our response loss mask."""
    samples = group_of_two()
    trainer = grpo_trainer(tokenizer, tmp_path, lambda prompts, _: to_trl_rollout(samples))
    out = trainer._generate_and_score_completions([{"prompt": "p0"}, {"prompt": "p0"}])
    ours = pad_split_batch(samples, pad_id=tokenizer.pad_token_id)
    assert out["prompt_ids"].tolist() == ours.prompt_ids.tolist()
    assert out["prompt_mask"].tolist() == ours.prompt_mask.tolist()
    assert out["completion_ids"].tolist() == ours.response_ids.tolist()
    assert out["completion_mask"].tolist() == ours.response_attention_mask.tolist()
    loss_mask = out["completion_mask"] * out["tool_mask"]
    assert loss_mask.tolist() == ours.response_loss_mask.tolist()
    assert out["tool_mask"][0].tolist() == MERGED_ENV_MASK
    assert ours.response_logprobs is not None
    np.testing.assert_array_equal(out["sampling_per_token_logps"].numpy(), ours.response_logprobs)
    advantages = out["advantages"].tolist()
    assert advantages[0] > 0 > advantages[1]  # reward 1 beats reward 0 in the group


def test_grpo_trainer_trains_a_step_on_our_rollout(tokenizer: Any, tmp_path: Path) -> None:
    """A full GRPOTrainer step runs on our rollout_func; its completion length counts only the
    tokens env_mask marks as sampled, and its reward is our forwarded reward."""
    samples = group_of_two()
    received: list[list[Any]] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        received.append(list(prompts))
        return to_trl_rollout(samples, num_generations=trainer.num_generations)

    trainer = grpo_trainer(tokenizer, tmp_path, rollout_func)
    result = trainer.train()
    assert result.global_step == 1
    # TRL hands each prompt num_generations times, consecutively: one row per entry it receives.
    assert len(received) == 1 and len(received[0]) == 2 and received[0][0] == received[0][1]
    logged = trainer.state.log_history[0]
    trained = [s.num_trained for s in samples]
    assert logged["completions/mean_length"] == pytest.approx(np.mean(trained))
    assert logged["reward"] == pytest.approx(0.5)


def test_async_grpo_packer_reads_our_rollout_samples_like_our_packed_batch() -> None:
    """Our records become TRL `RolloutSample`s; TRL's queue dataset and packer score exactly the
    next-token targets, old logprobs and advantages of `pack_batch(...).shifted()`."""
    from trl.experimental.async_grpo.async_grpo_trainer import (
        DataCollatorForRollout,
        RolloutQueueDataset,
    )
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
    from trl.experimental.async_grpo.packing import TreeRow

    samples = group_of_two()
    records = to_trl_rollout_samples(samples, model_version=3)
    rollouts: queue.Queue[Any] = queue.Queue()
    for record in records:
        rollouts.put(RolloutSample(**record))
    dataset = RolloutQueueDataset(
        rollouts,
        model_version_fn=lambda: 3,
        check_health_fn=lambda stale_after_s: None,
        stale_after_s=60,
        metrics=defaultdict(list),
    )
    stream = iter(dataset)
    row = TreeRow()
    for _ in records:
        row.add(next(stream))
    batch = DataCollatorForRollout(pad_token_id=0).torch_call([[row]])

    packed = pack_batch(samples, advantages=[r["advantage"] for r in records])
    shifted = packed.shifted()
    assert batch["input_ids"][0].tolist() == packed.input_ids.tolist()
    assert batch["position_ids"][0].tolist() == packed.position_ids.tolist()
    assert batch["shift_labels"][0].tolist() == shifted.labels.tolist()
    scored = batch["token_index"][0].numpy()
    assert scored.tolist() == np.flatnonzero(shifted.loss_mask).tolist()
    assert shifted.logprobs is not None and packed.advantages is not None
    np.testing.assert_array_equal(batch["old_log_probs"][0].numpy(), shifted.logprobs[scored])
    np.testing.assert_allclose(batch["advantages"][0].numpy(), packed.advantages[scored + 1])
