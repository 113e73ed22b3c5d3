"""Group-relative advantages (GRPO): each reward compared with the other rollouts of its task.

`advantage = (reward - mean_g) / (std_g + epsilon)` over the group g of the sample (`group_key`:
`group_id`, else `task_id`, else the episode alone), with the unbiased std, exactly verl's
`compute_grpo_outcome_advantage`; a group of one gets mean 0 and std 1 there, and here too. With
`normalize_std=False` it is `reward - mean_g` (Dr. GRPO). Vectorized: `np.unique` + `np.bincount`.

The unit of a group is a sample by default. A merged episode can yield several samples (one per
rewrite of its history); with `unit="episode"` each episode counts once in its group's statistics
and all its samples get its advantage (TRL AsyncGRPO's rule for conversations split into rows).
`unit="trajectory"` is the same rule per agent: each trajectory (`Sample.trajectory_id`, one
agent's linked segments in one episode; per-call samples and older files: episode and agent) counts
once, and all its segments (a compacted agent's summary call included) share its advantage. For a
one-agent episode the two units agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from tito_agents.convert._sample_fields import (
    ConversionError,
    group_key,
    require_one_view,
    rewards_array,
)
from tito_agents.samples import Sample, trajectory_id_for

MissingReward = Literal["error", "exclude"]
Unit = Literal["sample", "episode", "trajectory"]


def group_advantages(
    samples: Sequence[Sample],
    *,
    normalize_std: bool = True,
    epsilon: float = 1e-6,
    unit: Unit = "sample",
    missing_reward: MissingReward = "error",
) -> npt.NDArray[np.float32]:
    """One advantage per sample (float32, in sample order).

    `missing_reward="error"` raises `ConversionError` for a sample without reward; `"exclude"`
    leaves it out of its group's mean and std and gives it advantage 0 (TRL's rule for unscorable
    completions). With `unit="episode"` the samples of one episode must share one reward, with
    `unit="trajectory"` the segments of one trajectory. A group whose rewards are all equal gets
    advantage 0 even with `epsilon=0` (no signal, not 0/0). Both views of one episode
    (`assembly="both"`) in `samples` raise `ConversionError`: the rollout would count twice.
    """
    if unit not in ("sample", "episode", "trajectory"):
        raise ValueError(f"unit must be 'sample', 'episode' or 'trajectory', got {unit!r}")
    if missing_reward not in ("error", "exclude"):
        raise ValueError(f"missing_reward must be 'error' or 'exclude', got {missing_reward!r}")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    if not samples:
        return np.zeros(0, dtype=np.float32)
    require_one_view(samples)
    rewards = rewards_array(samples)
    missing = np.isnan(rewards)
    if missing.any() and missing_reward == "error":
        first = samples[int(np.flatnonzero(missing)[0])]
        raise ConversionError(
            f"sample {first.sample_id}: no reward (set one, or pass missing_reward='exclude')"
        )
    if unit != "sample":
        members, member_of = np.unique(
            np.array([f"{group_key(s)}\x00{_member(s, unit)}" for s in samples], dtype=object),
            return_inverse=True,
        )
        member_rewards = _member_rewards(samples, rewards, member_of, len(members), unit)
        member_groups = np.empty(len(members), dtype=object)
        member_groups[member_of] = [group_key(s) for s in samples]
        adv = _grpo(member_rewards, member_groups, normalize_std, epsilon)
        return adv[member_of]
    groups = np.array([group_key(s) for s in samples], dtype=object)
    return _grpo(rewards, groups, normalize_std, epsilon)


def trajectory_of(sample: Sample) -> str:
    """The trajectory a sample belongs to: its `trajectory_id`, else (per-call samples, files
    written before the field existed) the id its episode and agent give."""
    if sample.trajectory_id is not None:
        return sample.trajectory_id
    return trajectory_id_for(sample.episode_id, sample.agent)


def _member(sample: Sample, unit: Unit) -> str:
    """The episode, or the trajectory, a sample counts towards."""
    return sample.episode_id if unit == "episode" else trajectory_of(sample)


def _member_rewards(
    samples: Sequence[Sample],
    rewards: npt.NDArray[np.float64],
    member_of: npt.NDArray[np.intp],
    count: int,
    unit: Unit,
) -> npt.NDArray[np.float64]:
    out = np.full(count, np.nan)
    out[member_of] = rewards  # any one sample's reward per episode...
    # ...and all of them must agree (NaN == NaN counts as agreeing: no reward at all).
    differs = (rewards != out[member_of]) & ~(np.isnan(rewards) & np.isnan(out[member_of]))
    if differs.any():
        bad = samples[int(np.flatnonzero(differs)[0])]
        raise ConversionError(
            f"{unit} {_member(bad, unit)}: its samples have different rewards; unit={unit!r} "
            f"needs one reward per {unit} (use unit='sample', or no per-call rewards)"
        )
    return out


def _grpo(
    rewards: npt.NDArray[np.float64],
    groups: npt.NDArray[np.object_],
    normalize_std: bool,
    epsilon: float,
) -> npt.NDArray[np.float32]:
    """verl's GRPO outcome advantage over `rewards` grouped by `groups`; NaN rewards are skipped
    in the statistics and get advantage 0."""
    _, group_of = np.unique(groups, return_inverse=True)
    scored = ~np.isnan(rewards)
    values = np.where(scored, rewards, 0.0)
    weights = scored.astype(np.float64)
    count = np.bincount(group_of, weights=weights)
    total = np.bincount(group_of, weights=values)
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    sq_dev = np.where(scored, (values - mean[group_of]) ** 2, 0.0)
    ss = np.bincount(group_of, weights=sq_dev, minlength=len(count))
    std = np.sqrt(np.divide(ss, count - 1, out=np.zeros_like(ss), where=count > 1))
    singleton = count <= 1
    mean[singleton] = 0.0
    std[singleton] = 1.0
    centered = values - mean[group_of]
    if normalize_std:  # a zero denominator (epsilon 0, equal rewards) has centered 0: advantage 0
        denom = std[group_of] + epsilon
        adv: npt.NDArray[np.float64] = np.divide(
            centered, denom, out=np.zeros_like(centered), where=denom > 0
        )
    else:
        adv = centered
    adv[~scored] = 0.0
    return adv.astype(np.float32)
