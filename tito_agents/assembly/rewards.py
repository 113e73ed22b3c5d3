"""The reward of a merged sample: the episode's outcome plus its calls' own rewards, discounted
from the sample's first call (`tito_agents.assembly.merged`, "Rewards")."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["check_discount", "merged_reward"]


def merged_reward(
    call_rewards: Sequence[float | None], episode_reward: float | None, turn_discount: float = 1.0
) -> float | None:
    """`episode_reward + sum_k turn_discount**k * call_rewards[k]` (unset terms count 0).

    None when the episode reward and every call reward are unset.
    """
    discount = check_discount(turn_discount)
    if episode_reward is None and all(r is None for r in call_rewards):
        return None
    total = 0.0 if episode_reward is None else float(episode_reward)
    weight = 1.0
    for reward in call_rewards:
        if reward is not None:
            total += weight * float(reward)
        weight *= discount
    return total


def check_discount(turn_discount: float) -> float:
    """The discount as a float in [0, 1]; anything else is refused before any sample is made."""
    value = float(turn_discount)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"turn_discount must be in [0, 1], got {turn_discount!r}")
    return value
