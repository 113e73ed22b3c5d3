"""Group-relative (GRPO) advantages by group, with verl's formula and TRL's missing-reward rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.convert_samples import single_sample
from tito_agents.convert import ConversionError, group_advantages


def test_grpo_advantage_is_the_group_z_score() -> None:
    """(r - group mean) / (unbiased group std + 1e-6); a constant group gets 0, a lone sample r."""
    rewards = [("g1", 1.0), ("g2", 3.0), ("g1", 0.0), ("g3", 2.0), ("g1", 1.0), ("g3", 2.0)]
    rewards.append(("g1", 0.0))
    samples = [
        single_sample(group_id=g, reward=r, episode_id=f"e{i}") for i, (g, r) in enumerate(rewards)
    ]
    adv = group_advantages(samples)
    z = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    expected = [z, 3.0 / (1 + 1e-6), -z, 0.0, z, 0.0, -z]
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    assert adv.dtype == np.float32


def test_without_std_normalisation_it_is_the_centered_reward() -> None:
    """`normalize_std=False` gives reward minus group mean (Dr. GRPO)."""
    samples = [single_sample(group_id="g", reward=r, episode_id=f"e{r}") for r in (1.0, 0.0, 2.0)]
    np.testing.assert_allclose(group_advantages(samples, normalize_std=False), [0.0, -1.0, 1.0])


def test_missing_rewards_raise_or_are_excluded() -> None:
    """A sample without reward is an error, or is left out of the stats with advantage 0."""
    samples = [
        single_sample(group_id="g", reward=1.0, episode_id="a"),
        single_sample(group_id="g", reward=None, episode_id="b"),
        single_sample(group_id="g", reward=0.0, episode_id="c"),
    ]
    with pytest.raises(ConversionError, match="no reward"):
        group_advantages(samples)
    adv = group_advantages(samples, missing_reward="exclude")
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(adv, [z, 0.0, -z], rtol=1e-6)


def test_episode_unit_counts_each_episode_once() -> None:
    """With unit="episode" an episode split into two samples weighs once and both get its advantage."""
    samples = [
        single_sample(group_id="g", reward=1.0, episode_id="A"),
        single_sample(group_id="g", reward=1.0, episode_id="A"),
        single_sample(group_id="g", reward=0.0, episode_id="B"),
    ]
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(group_advantages(samples, unit="episode"), [z, z, -z], rtol=1e-6)
    per_sample = group_advantages(samples)
    assert not np.allclose(per_sample, [z, z, -z])
    samples[1].reward = 0.5
    with pytest.raises(ConversionError, match="different rewards"):
        group_advantages(samples, unit="episode")


def test_groups_fall_back_to_task_id() -> None:
    """Samples without group_id are grouped by task_id."""
    samples = [
        single_sample(group_id=None, task_id="t", reward=r, episode_id=f"e{r}") for r in (0.0, 2.0)
    ]
    adv = group_advantages(samples, normalize_std=False)
    np.testing.assert_allclose(adv, [-1.0, 1.0])
