"""Hand-built samples for the converter tests, and the split / group rules every converter shares."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tito_agents.convert import (
    ConversionError,
    group_key,
    policy_version_of,
    prompt_length,
    stable_int_id,
)
from tito_agents.samples import CallSpan, Sample

Piece = tuple[str, Sequence[int]]
"""("ctx", ids) = context the engine did not sample (loss 0); ("gen", ids) = sampled ids (loss 1)."""


def logprob_of(token: int) -> float:
    """The rollout logprob the hand-built samples give a sampled token: unique per id."""
    return -token / 1000.0


def build_sample(
    pieces: Sequence[Piece],
    *,
    sample_id: str = "s",
    episode_id: str | None = None,
    reward: float | None = 1.0,
    group_id: str | None = "g",
    task_id: str | None = None,
    with_logprobs: bool = True,
    policy_version: str | None = None,
) -> Sample:
    """A sample whose spans follow `pieces`: each "gen" piece closes one call whose context is the
    "ctx" pieces since the previous call."""
    ids: list[int] = []
    mask: list[int] = []
    spans: list[CallSpan] = []
    context_start = 0
    for kind, chunk in pieces:
        assert kind in ("ctx", "gen")
        start = len(ids)
        ids.extend(chunk)
        mask.extend([1 if kind == "gen" else 0] * len(chunk))
        if kind == "gen":
            call_id = f"{sample_id}-c{len(spans)}"
            spans.append(
                CallSpan(call_id, context_start, start, len(ids), "stop", None, policy_version)
            )
            context_start = len(ids)
    token_ids = np.array(ids, dtype=np.int32)
    loss_mask = np.array(mask, dtype=np.uint8)
    logprobs = None
    if with_logprobs:
        logprobs = np.where(loss_mask == 1, -token_ids / 1000.0, 0.0).astype(np.float32)
    sample = Sample(
        sample_id=sample_id,
        episode_id=episode_id or f"ep-{sample_id}",
        agent="main",
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        reward=reward,
        call_ids=[s.call_id for s in spans],
        spans=spans,
        task_id=task_id,
        group_id=group_id,
        model="m",
    )
    sample.validate()
    return sample


# A merged sample with three calls: prompt, answer, tool result, answer, user turn, answer.
MERGED_PIECES: list[Piece] = [
    ("ctx", [101, 102, 103, 104]),
    ("gen", [201, 202]),
    ("ctx", [301, 302, 303]),
    ("gen", [203, 204, 205]),
    ("ctx", [304]),
    ("gen", [206]),
]
# A per-call sample: a 2-token prompt and a 4-token answer.
SINGLE_PIECES: list[Piece] = [("ctx", [111, 112]), ("gen", [211, 212, 213, 214])]


def merged_sample(**kwargs: Any) -> Sample:
    return build_sample(MERGED_PIECES, sample_id="merged", **kwargs)


def single_sample(**kwargs: Any) -> Sample:
    return build_sample(SINGLE_PIECES, sample_id="single", **kwargs)


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
