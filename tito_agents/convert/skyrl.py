"""SkyRL hand-off: the rows of a `GeneratorOutput` (skyrl 0.4 `skyrl/train/generators/base.py`).

A SkyRL generator returns, per row, `prompt_token_ids`, `response_ids`, `loss_masks`,
`rollout_logprobs` (one per response token) and `rewards`; with `generator.step_wise_trajectories`
a trajectory may span several rows ("steps"), adjacent, the last flagged by `is_last_step`, all
sharing one `TrajectoryID`. The trainer computes a trajectory's advantage from its last step and
gives it to every step (`trainer.py`, `compute_advantages_and_returns`).

Here each merged sample is a row: the split is its first sampled token (`prompt_length`), every
later token (the model's turns, tool results and template tokens between them) is response with
its loss mask. A trajectory of several linked segments (compaction, a rewritten history) is one
step per segment, in segment order: each step's prompt is exactly what the model saw when that
segment began. Its reward sits on the last step; earlier steps carry 0.0, as SkyRL's own
step-wise generator gives a step without an environment reward. Arrays are plain lists, unpadded
and unshifted, as SkyRL wants them; no skyrl import is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tito_agents.convert._sample_fields import (
    ConversionError,
    require_one_view,
    require_samples,
    reward_of,
)
from tito_agents.convert._sample_fields import prompt_length as split_point
from tito_agents.convert.advantages import trajectory_of
from tito_agents.samples import Sample


def to_skyrl_steps(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One SkyRL row per sample, trajectories kept together and their segments in order:
    `prompt_token_ids`, `response_ids`, `loss_mask`, `rollout_logprobs` (None when not captured),
    `reward` (on the trajectory's last step, 0.0 before it), `stop_reason` (the last call's finish
    reason), `is_last_step`, `trajectory_id` and `segment_index`.

    Raises `ConversionError` for a sample without a reward: SkyRL needs one on every row."""
    require_samples(samples)
    require_one_view(samples)
    trajectories: dict[str, list[Sample]] = {}
    for sample in samples:
        trajectories.setdefault(trajectory_of(sample), []).append(sample)
    rows: list[dict[str, Any]] = []
    for trajectory, segments in trajectories.items():
        segments.sort(key=lambda s: s.segment_index or 0)
        for position, sample in enumerate(segments):
            last = position == len(segments) - 1
            rows.append(_step(sample, trajectory, is_last_step=last))
    return rows


def _step(sample: Sample, trajectory: str, *, is_last_step: bool) -> dict[str, Any]:
    reward = reward_of(sample)
    if reward is None:
        raise ConversionError(f"sample {sample.sample_id}: no reward; SkyRL needs one per row")
    split = split_point(sample)
    old = sample.ratio_logprobs()
    return {
        "prompt_token_ids": sample.token_ids[:split].tolist(),
        "response_ids": sample.token_ids[split:].tolist(),
        "loss_mask": sample.loss_mask[split:].tolist(),
        "rollout_logprobs": None if old is None else old[split:].tolist(),
        "reward": reward if is_last_step else 0.0,
        "stop_reason": _stop_reason(sample),
        "is_last_step": is_last_step,
        "trajectory_id": trajectory,
        "segment_index": sample.segment_index,
    }


def _stop_reason(sample: Sample) -> str:
    """The last call's finish reason, as vLLM gives it ("stop", "length", "tool_calls", ...)."""
    if not sample.spans:
        return "stop"
    last = max(sample.spans, key=lambda span: span.end)
    return last.finish_reason or "stop"
