"""TRL hand-off: what a `GRPOTrainer` `rollout_func` returns, and AsyncGRPO `RolloutSample` fields.

`GRPOTrainer(rollout_func=...)` (TRL >= 0.25; checked against 1.16) calls
`rollout_func(prompts, trainer)` and reads `prompt_ids`, `completion_ids` and `logprobs` (lists of
lists, one row per completion, `num_generations` consecutive rows per prompt); it pops `env_mask`
(1 = model token, 0 = tool/environment token inside the completion) as its `tool_mask`, and forwards
every other key to the reward functions. It pads itself (prompts left, completions right). Here the
completion is everything after the sample's first sampled token, so the tool results and template
tokens between a merged sample's calls sit inside it with `env_mask` 0.

`trl.experimental.async_grpo.RolloutSample` (TRL 1.16) takes flat `input_ids`, `completion_mask`
(1 = train), `old_log_probs` (0.0 off the trained tokens) as numpy arrays, a producer-computed
`advantage`, an int `model_version` and an int `group_id`: `RolloutSample(**record)` works on each
record of `to_trl_rollout_samples`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

from tito_agents.convert._arrays import check_advantages
from tito_agents.convert._sample_fields import (
    ConversionError,
    group_key,
    policy_version_of,
    prompt_length,
    require_one_view,
    require_samples,
    reward_of,
    stable_int_id,
)
from tito_agents.convert.advantages import MissingReward, Unit, group_advantages
from tito_agents.samples import Sample

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
"""The keys TRL's `GRPOTrainer._generate` requires of a `rollout_func` result."""


def trl_logprobs(sample: Sample) -> list[float | None]:
    """Per-token old-policy logprobs for TRL: `Sample.ratio_logprobs`, with None on tokens of
    constrained spans that were not re-scored (their logprobs are the masked distribution's, which
    no trainer recomputes) and everywhere when the sample has no logprobs."""
    values = sample.ratio_logprobs()
    if values is None:
        return [None] * sample.num_tokens
    out: list[float | None] = values.tolist()
    for span in sample.spans:
        if span.logprob_source == "masked":
            out[span.start : span.end] = [None] * (span.end - span.start)
    return out


def to_trl_rollout(
    samples: Sequence[Sample],
    *,
    reward_key: str | None = "reward",
    extra_fields: Mapping[str, Sequence[Any]] | None = None,
    num_generations: int | None = None,
) -> dict[str, list[Any]]:
    """The dict a TRL `rollout_func` returns for `samples`, one completion per sample, in order.

    Rows are Python lists (TRL's documented types): `prompt_ids`, `completion_ids`, `logprobs`
    (the old policy's, `trl_logprobs`: None per token where there is none the policy would
    recompute — no logprobs captured, or a constrained span not re-scored; TRL turns None into NaN
    and neutralises it in its importance-sampling correction) and `env_mask`. `reward_key` adds
    the samples' rewards as an extra field for `passthrough_reward`; `extra_fields` adds more (one
    value per sample).
    `num_generations`, when given, checks that consecutive blocks of that many samples share a
    GRPO group and that no episode appears twice (TRL groups rows by position, one per rollout).
    """
    require_samples(samples)
    require_one_view(samples)
    if num_generations is not None:
        check_generation_blocks(samples, num_generations)
    out: dict[str, list[Any]] = {key: [] for key in (*REQUIRED_KEYS, "env_mask")}
    if reward_key in out:
        raise ValueError(f"reward_key {reward_key!r} would overwrite a rollout field")
    for sample in samples:
        split = prompt_length(sample)
        out["prompt_ids"].append(sample.token_ids[:split].tolist())
        out["completion_ids"].append(sample.token_ids[split:].tolist())
        out["logprobs"].append(trl_logprobs(sample)[split:])
        out["env_mask"].append(sample.loss_mask[split:].tolist())
    if reward_key is not None:
        out[reward_key] = [reward_of(s) for s in samples]
    for key, values in (extra_fields or {}).items():
        if key in out:
            raise ValueError(f"extra field {key!r} would overwrite a rollout field")
        if len(values) != len(samples):
            raise ValueError(
                f"extra field {key!r}: {len(values)} values for {len(samples)} samples"
            )
        out[key] = list(values)
    return out


def passthrough_reward(
    prompts: Sequence[Any], completions: Sequence[Any], reward: Sequence[float | None], **_: Any
) -> list[float | None]:
    """A TRL reward function that returns the rewards `to_trl_rollout` forwarded (`reward_key`
    "reward"): pass it as `reward_funcs=passthrough_reward` to train on the agent's own rewards."""
    if len(reward) != len(completions):
        raise ValueError(f"{len(reward)} rewards for {len(completions)} completions")
    return [None if r is None else float(r) for r in reward]


def check_generation_blocks(samples: Sequence[Sample], num_generations: int) -> None:
    """Raise `ConversionError` unless `samples` are whole blocks of `num_generations` consecutive
    samples of one group each, every episode at most once."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if len(samples) % num_generations:
        raise ConversionError(
            f"{len(samples)} samples are not whole groups of num_generations={num_generations}"
        )
    seen: set[str] = set()
    for i, sample in enumerate(samples):
        if sample.episode_id in seen:
            raise ConversionError(
                f"episode {sample.episode_id} gives several samples: TRL takes one completion per "
                "rollout (keep one sample per episode, e.g. the last)"
            )
        seen.add(sample.episode_id)
        head = samples[i - i % num_generations]
        if group_key(sample) != group_key(head):
            raise ConversionError(
                f"sample {sample.sample_id} (position {i}) is not in the group of its block "
                f"({group_key(head)!r} != {group_key(sample)!r}): order samples by group"
            )


class TrlRolloutSampleFields(TypedDict):
    """The fields of `trl.experimental.async_grpo.RolloutSample` (TRL 1.16), minus `enqueued_at`."""

    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    input_ids: npt.NDArray[np.int64]
    completion_mask: npt.NDArray[np.int64]
    old_log_probs: npt.NDArray[np.float32]
    advantage: float
    model_version: int
    group_id: int
    metrics: dict[str, float]


def to_trl_rollout_samples(
    samples: Sequence[Sample],
    *,
    advantages: Sequence[float] | npt.NDArray[Any] | None = None,
    model_version: int | None = None,
    unit: Unit = "episode",
    missing_reward: MissingReward = "exclude",
) -> list[TrlRolloutSampleFields]:
    """One AsyncGRPO `RolloutSample` field dict per sample (flat and unshifted, as TRL wants).

    `advantages` default to `group_advantages(samples, unit=unit, missing_reward=missing_reward)`:
    per episode, samples without reward get 0, like TRL's own worker. `model_version` defaults to
    the sample's integer `policy_version` (oldest span); TRL drops samples by staleness, so one of
    the two is required. `group_id` is a stable int63 of `group_key`, the same across batches.
    `prompt` / `completion` messages are left empty: samples keep token ids, not messages.
    """
    require_samples(samples)
    require_one_view(samples)
    if advantages is None:
        adv = group_advantages(samples, unit=unit, missing_reward=missing_reward)
    else:
        adv = check_advantages(advantages, len(samples))
    records: list[TrlRolloutSampleFields] = []
    for sample, advantage in zip(samples, adv.tolist(), strict=True):
        old = sample.ratio_logprobs()
        if old is None:
            raise ConversionError(
                f"sample {sample.sample_id}: no logprobs, which AsyncGRPO's old_log_probs needs "
                "(capture with Collector(capture_logprobs=True))"
            )
        version = model_version if model_version is not None else policy_version_of(sample)
        if version is None:
            raise ConversionError(
                f"sample {sample.sample_id}: no integer policy_version; pass model_version= "
                "(TRL drops samples by staleness against it)"
            )
        reward = float("nan") if (given := reward_of(sample)) is None else given
        records.append(
            {
                "prompt": [],
                "completion": [],
                "input_ids": sample.token_ids.astype(np.int64),
                "completion_mask": sample.loss_mask.astype(np.int64),
                "old_log_probs": old.astype(np.float32, copy=True),
                "advantage": float(advantage),
                "model_version": int(version),
                "group_id": stable_int_id(group_key(sample)),
                "metrics": {"reward": reward},
            }
        )
    return records
