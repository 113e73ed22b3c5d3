"""What every converter reads off a sample: where its prompt ends, its GRPO group, its rewards.

The prompt/response split used by verl and TRL is the sample's first sampled position: everything
before it (the first call's prompt) is the prompt; everything from it on (sampled ids, tool results,
later user turns, template glue) is the response, with the loss mask saying which of those tokens
were sampled. For a merged sample whose first call sampled late, all earlier context is prompt.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tito_agents.calls import policy_of
from tito_agents.errors import SampleFormatError
from tito_agents.samples import Sample


class ConversionError(SampleFormatError):
    """A sample cannot be laid out the way a converter was asked to (nothing sampled, longer than
    a fixed width, no reward where one is required, ...). The message names the sample."""


def prompt_length(sample: Sample) -> int:
    """Where `sample`'s prompt ends: the first call's prompt length (the smallest span start), or,
    for a sample without spans, the first position with loss 1.

    Raises `ConversionError` when nothing in the sample was sampled, or when a trained position lies
    inside the prompt (it would silently lose its loss in a prompt/response layout).
    """
    if sample.spans:
        split = min(span.start for span in sample.spans)
    else:
        trained = np.flatnonzero(sample.loss_mask)
        if trained.size == 0:
            raise ConversionError(
                f"sample {sample.sample_id}: no sampled token, so no prompt/response split"
            )
        split = int(trained[0])
    if split >= sample.num_tokens:
        raise ConversionError(f"sample {sample.sample_id}: empty response (prompt is everything)")
    if sample.loss_mask[:split].any():
        raise ConversionError(
            f"sample {sample.sample_id}: loss 1 before the first call's sampled ids (position "
            f"{int(np.flatnonzero(sample.loss_mask[:split])[0])} < {split})"
        )
    return split


def group_key(sample: Sample) -> str:
    """The GRPO group of a sample: `group_id`, else `task_id`, else its own `episode_id` (a group of
    one). Samples of the same task sampled N times must share it (`collector.episode(group_id=...)`).
    With one policy per agent (`Collector(policies=...)`) a group is per (policy, group): the key
    is `"<policy>:<group>"`, so each policy's rollouts are compared only with its own.

    Always a `str`: samples built by hand or read from older files may hold an int or numpy int
    id, which would otherwise break sorting against string ids and `stable_int_id`."""
    if sample.group_id is not None:
        key = str(sample.group_id)
    elif sample.task_id is not None:
        key = str(sample.task_id)
    else:
        key = str(sample.episode_id)
    policy = policy_of(sample)
    return key if policy is None else f"{policy}:{key}"


def stable_int_id(key: str) -> int:
    """A non-negative int63 derived from `key`, the same in every process and run (for trainers that
    want integer group ids): batches converted separately never reuse one id for two groups."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF


def policy_version_of(sample: Sample) -> int | None:
    """The weight version a sample was sampled with: the smallest integer `policy_version` of its
    spans (the oldest weights that produced any of its tokens), None when no span has one."""
    versions: list[int] = []
    for span in sample.spans:
        if span.policy_version is None:
            continue
        try:
            versions.append(int(span.policy_version))
        except ValueError:
            continue
    return min(versions) if versions else None


FLOAT32_MAX = float(np.finfo(np.float32).max)


def reward_of(sample: Sample) -> float | None:
    """`sample.reward` as a float (None when unset), refusing what no trainer can use: NaN, inf
    and values beyond float32 (verl's `rm_scores` and TRL's reward tensors are float32, where they
    turn into inf and then NaN advantages). Capture refuses them too (`finite_or_none`); a sample
    built by hand or read from another tool's file may still hold one."""
    if sample.reward is None:
        return None
    value = float(sample.reward)
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise ConversionError(
            f"sample {sample.sample_id}: reward {value!r} is not a finite float32 number "
            "(fix the reward, or set None for an unscored rollout)"
        )
    return value


def rewards_array(samples: Sequence[Sample]) -> npt.NDArray[np.float64]:
    """Rewards as float64, NaN where a sample has none (`reward_of` refuses a NaN reward)."""
    return np.fromiter(
        (np.nan if (r := reward_of(s)) is None else r for s in samples),
        dtype=np.float64,
        count=len(samples),
    )


def require_one_view(samples: Sequence[Sample]) -> None:
    """Refuse a batch holding both the per-call and the merged samples of one episode
    (`assembly="both"`): they carry the same sampled tokens, so the rollout would be trained, and
    counted in its GRPO group, twice. `ConversionError` names the episode."""
    views: dict[str, str] = {}
    for sample in samples:
        seen = views.setdefault(sample.episode_id, sample.view)
        if seen != sample.view:
            raise ConversionError(
                f"episode {sample.episode_id}: both per_call and merged samples in one batch "
                "(assembly='both'); train on one view: keep the samples whose Sample.view is the "
                "one you want"
            )


def require_samples(samples: Sequence[Sample]) -> None:
    if not samples:
        raise ValueError("no samples to convert")
