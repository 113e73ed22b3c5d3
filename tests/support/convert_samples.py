"""Hand-built samples for the converter tests: context and sampled pieces, unique logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

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
