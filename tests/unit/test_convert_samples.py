"""The split / group rules every converter shares, on hand-built samples."""

from __future__ import annotations

import pytest

from tests.support.convert_samples import build_sample, merged_sample, single_sample
from tito_agents.convert import (
    ConversionError,
    group_key,
    policy_version_of,
    prompt_length,
    stable_int_id,
)


def test_prompt_ends_at_first_sampled_token() -> None:
    """The prompt/response split is the first call's sampled start, for merged and per-call samples."""
    assert prompt_length(merged_sample()) == 4
    assert prompt_length(single_sample()) == 2


def test_prompt_length_without_spans_uses_loss_mask() -> None:
    """A sample without spans splits at its first loss-1 position."""
    sample = merged_sample()
    sample.spans = []
    assert prompt_length(sample) == 4


def test_prompt_length_refuses_unsampled_or_inconsistent_samples() -> None:
    """A sample with nothing sampled, or loss 1 inside the first call's prompt, cannot be split."""
    empty = build_sample([("ctx", [1, 2, 3])])
    with pytest.raises(ConversionError, match="no sampled token"):
        prompt_length(empty)
    bad = merged_sample()
    bad.loss_mask[1] = 1
    with pytest.raises(ConversionError, match="loss 1 before"):
        prompt_length(bad)


def test_group_key_falls_back_to_task_then_episode() -> None:
    """GRPO groups come from group_id, else task_id, else the episode alone."""
    assert group_key(single_sample(group_id="g1", task_id="t1")) == "g1"
    assert group_key(single_sample(group_id=None, task_id="t1")) == "t1"
    assert group_key(single_sample(group_id=None, episode_id="e9")) == "e9"


def test_stable_int_id_is_deterministic_and_int63() -> None:
    """Integer group ids do not depend on the batch: same key, same id; always in [0, 2**63)."""
    assert stable_int_id("task-1") == stable_int_id("task-1")
    assert stable_int_id("task-1") != stable_int_id("task-2")
    assert 0 <= stable_int_id("x") < 2**63


def test_policy_version_is_the_oldest_integer_span_version() -> None:
    """A sample's policy version is the smallest integer version of its spans; None when absent."""
    sample = merged_sample(policy_version="7")
    sample.spans[1].policy_version = "5"
    sample.spans[2].policy_version = "not-a-number"
    assert policy_version_of(sample) == 5
    assert policy_version_of(merged_sample()) is None
