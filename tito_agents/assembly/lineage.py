"""Lineage of merged samples: the segments of one agent's trajectory, linked, and the kind of
history rewrite that started each one.

A long-horizon agent rewrites its own history (compaction, trimming old messages, templates that
drop old reasoning, an edited message). Merged assembly already splits there and keeps every sampled
token trained exactly once; this module says which samples belong together, so a trainer can treat
them as one trajectory (one advantage, one reward) instead of unrelated rows.

Trajectory
    One agent's calls in one episode (`trajectory_id_for(episode_id, agent)`). Its samples are its
    *segments*, numbered in order of their first call (`segment_index`); each names the previous
    one (`prev_sample_id`), so the segments form one linked list. The divergence records keep the
    tree (which segment's history each one rewrote: `Divergence.prev_sample_id`).

Summarising calls
    A call labelled `role="summarizer"` (`tito_agents.labels(role="summarizer")`, or set by an
    integration: the LangChain adapter labels `SummarizationMiddleware`'s model call) must run under
    the same agent as the calls it summarises: it is a segment of that agent's trajectory, trained
    with the episode's reward like every other segment, and its span's `role` says it is a summary.
    An unlabelled call is recognised as a summariser when its sampled ids reappear in a later
    rewritten prompt of the agent (its span's role then says "summarizer" too).

Rewrite kinds (`Sample.rewrite`), first match wins, for a segment that is not a resample, a branch,
a policy switch or a summarising call itself:

* "summary": a summarising call of the agent ran since the history was last extended (the call
  labelled so, or one whose sampled ids appear in the new prompt after the rewrite point);
* "completion_truncated": `DivergenceKind.TRUNCATION`;
* "reasoning_cleared": `TEMPLATE_RERENDER` and the old history after the rewrite point held a
  reasoning block (`<think>…</think>`, …; needs `decode`);
* "rerendered": other template re-renders and `RETOKENIZED` (same text, other ids);
* "prefix_truncated": the new prompt continues with a later part of the old history (messages
  removed, the rest kept);
* "message_edited": `HISTORY_REWRITE` or `OTHER` otherwise (a message was changed).

Cost: each test looks at the bounded window the classifier already uses
(`divergence.TEXT_WINDOW_TOKENS`); finding summary ids in a prompt is a byte search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import numpy as np

from tito_agents.assembly.divergence import (
    TEXT_WINDOW_TOKENS,
    Decode,
    DivergenceKind,
    has_reasoning_block,
)
from tito_agents.calls import Call, IdArray
from tito_agents.samples import ROLE_LABEL, SUMMARIZER_ROLE, Sample, trajectory_id_for

__all__ = ["call_role", "contains_ids", "link_segments", "rewrite_kind", "segment_rewrite"]

_PROBE = 16
"""Ids of the new tail searched for in the old one (prefix truncation)."""
MIN_KEPT_IDS = 8
"""At least this many ids of the old history must be kept for a rewrite to count as a truncation."""
_HEADER_IDS = 4
"""Ids of a call's prompt end (the assistant turn's opening) that precede a replayed answer."""
_CANDIDATES = 4
"""Unlabelled summarisers are looked for among this many latest single-call segments (a summary is
made just before the rewrite that uses it; the bound keeps long episodes linear)."""
MIN_SUMMARY_IDS = 8
"""A completion shorter than this is never taken for a summary by its ids alone."""


def call_role(call: Call) -> str | None:
    """The call's role label (`ROLE_LABEL`), when it is a string."""
    role = call.labels.get(ROLE_LABEL) if call.labels else None
    return role if isinstance(role, str) else None


def contains_ids(haystack: IdArray, needle: IdArray) -> bool:
    """Whether `needle` occurs contiguously in `haystack` (a byte search on aligned int32 ids)."""
    n = int(needle.shape[0])
    if n == 0 or n > haystack.shape[0]:
        return n == 0
    hay = np.ascontiguousarray(haystack, dtype=np.int32).tobytes()
    pin = np.ascontiguousarray(needle, dtype=np.int32).tobytes()
    at = hay.find(pin)
    while at != -1:
        if at % 4 == 0:
            return True
        at = hay.find(pin, at + 1)
    return False


def summary_ids(call: Call, eos_ids: frozenset[int]) -> IdArray:
    """A call's sampled ids without a trailing end-of-turn id (what a later prompt would quote)."""
    ids = call.sampled_ids
    if ids.size and (int(ids[-1]) in eos_ids):
        ids = ids[:-1]
    return ids


class Segment(Protocol):
    """What lineage reads of a growing merged sample (`merged._Chain`)."""

    calls: list[Call]
    touched: int

    def common_prefix(self, prompt_ids: IdArray) -> int: ...

    def tail(self, position: int, limit: int | None = None) -> IdArray: ...


class _Options(Protocol):
    @property
    def decode(self) -> Decode | None: ...

    @property
    def eos_ids(self) -> frozenset[int]: ...


def segment_rewrite(
    call: Call,
    segments: Sequence[Segment],
    parent: Segment,
    kind: DivergenceKind,
    old_tail: IdArray,
    new_tail: IdArray,
    options: _Options,
) -> tuple[str | None, str | None]:
    """The rewrite kind of the segment `call` starts, and the id of an unlabelled summariser
    recognised on the way. `parent` is the segment the divergence analysis compared with (longest
    common prefix); the agent's latest segment is what it was continuing, so a truncation is also
    looked for against it (after two truncations the oldest history may share the longer prefix)."""
    if call_role(call) == SUMMARIZER_ROLE or kind in (
        DivergenceKind.RESAMPLE,
        DivergenceKind.BRANCH,
    ):
        return None, None  # a summary call's own request; siblings, not rewrites
    latest = max(segments, key=lambda seg: seg.touched)
    recent = sorted(
        (
            seg
            for seg in segments
            if seg is not parent and len(seg.calls) == 1 and seg.touched > parent.touched
        ),
        key=lambda seg: seg.touched,
        reverse=True,
    )
    singles = [seg.calls[0] for seg in recent[:_CANDIDATES]]
    summarized, inferred = summarizer_before(
        call, latest.calls[-1], singles, new_tail, options.eos_ids
    )
    rewrite = rewrite_kind(
        kind, old_tail=old_tail, new_tail=new_tail, summarized=summarized, decode=options.decode
    )
    if rewrite == "message_edited" and latest is not parent:
        point = latest.common_prefix(call.prompt_ids)
        if prefix_dropped(latest.tail(point, TEXT_WINDOW_TOKENS + 1), call.prompt_ids[point:]):
            rewrite = "prefix_truncated"
    return rewrite, inferred


def summarizer_before(
    call: Call,
    recent: Call,
    candidates: Iterable[Call],
    new_tail: IdArray,
    eos_ids: frozenset[int],
) -> tuple[bool, str | None]:
    """Whether a summarising call ran before `call` rewrote its history, and the id of an
    unlabelled one recognised by its ids (None when it was labelled, or none ran).

    `new_tail` is `call`'s prompt after the rewrite point. `recent` is the agent's call just
    before `call`; `candidates` are the single-call segments
    made since the parent segment's last call (a summariser's own request extends no history),
    the parent excluded: its last answer may be kept verbatim by a plain truncation."""
    if call_role(call) == SUMMARIZER_ROLE:
        return False, None  # the summarising call itself
    if call_role(recent) == SUMMARIZER_ROLE:
        return True, None
    point = int(call.prompt_ids.shape[0] - new_tail.shape[0])
    for candidate in candidates:
        ids = summary_ids(candidate, eos_ids)
        n = int(ids.shape[0])
        # every occurrence that ends after the rewrite point (a quote may straddle it)
        found_in = call.prompt_ids[max(0, point - n + 1) :]
        if n < MIN_SUMMARY_IDS or not contains_ids(found_in, ids):
            continue
        # Quoted, not replayed: an answer kept in the history follows the header its own prompt
        # ended with (the assistant turn's opening); a summary sits inside another message.
        header = candidate.prompt_ids[-_HEADER_IDS:]
        if not contains_ids(found_in, np.concatenate((header, ids))):
            return True, candidate.call_id
    return False, None


def rewrite_kind(
    kind: DivergenceKind,
    *,
    old_tail: IdArray,
    new_tail: IdArray,
    summarized: bool,
    decode: Decode | None,
) -> str | None:
    """`Sample.rewrite` of a segment started by a divergence of `kind` (module docstring rules).

    `old_tail` is the parent's history after the rewrite point, `new_tail` the new prompt after
    it (both windowed by the caller); `summarized`: a summarising call ran since the parent's
    last call."""
    if kind in (DivergenceKind.RESAMPLE, DivergenceKind.BRANCH, DivergenceKind.POLICY_SWITCH):
        return None
    if summarized:
        return "summary"
    if kind is DivergenceKind.TRUNCATION:
        return "completion_truncated"
    if kind is DivergenceKind.TEMPLATE_RERENDER:
        return "reasoning_cleared" if _had_reasoning(old_tail, decode) else "rerendered"
    if kind is DivergenceKind.RETOKENIZED:
        return "rerendered"
    if prefix_dropped(old_tail, new_tail):
        return "prefix_truncated"
    return "message_edited"


def prefix_dropped(old_tail: IdArray, new_tail: IdArray) -> bool:
    """Whether the new tail starts with the old tail less some leading ids (messages removed)."""
    window = old_tail[: TEXT_WINDOW_TOKENS + 1]
    probe = new_tail[: min(_PROBE, int(window.shape[0]))]
    if probe.size == 0:
        return False
    first = int(probe[0])
    for j in np.flatnonzero(window[1:] == first)[:64].tolist():
        rest = window[j + 1 :]
        if rest.shape[0] < MIN_KEPT_IDS:
            break  # a few ids kept by chance are no evidence
        if rest.shape[0] <= new_tail.shape[0] and np.array_equal(new_tail[: rest.shape[0]], rest):
            return True
    return False


def _had_reasoning(old_tail: IdArray, decode: Decode | None) -> bool:
    if decode is None:
        return False
    try:
        text = decode(old_tail[:TEXT_WINDOW_TOKENS].tolist())
    except Exception:  # a user-supplied decode: diagnostics must not lose the episode's samples
        return False
    return has_reasoning_block(text)


def link_segments(
    samples: Iterable[Sample], episode_id: str, rewrites: dict[str, str | None]
) -> None:
    """Give merged samples (in order of their first call) their trajectory fields, in place.

    `rewrites` maps a sample id to the rewrite kind of the divergence that started it."""
    last: dict[str | None, Sample] = {}
    for sample in samples:
        prev = last.get(sample.agent)
        sample.trajectory_id = trajectory_id_for(episode_id, sample.agent)
        sample.segment_index = 0 if prev is None else (prev.segment_index or 0) + 1
        sample.prev_sample_id = None if prev is None else prev.sample_id
        # a summarising call's own prompt is a request, not a rewrite of the history
        first_role = sample.spans[0].role if sample.spans else None
        sample.rewrite = None if first_role == SUMMARIZER_ROLE else rewrites.get(sample.sample_id)
        last[sample.agent] = sample


def trajectory_segments(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """Samples by trajectory id, each list in segment order (samples without one are skipped)."""
    out: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.trajectory_id is not None:
            out.setdefault(sample.trajectory_id, []).append(sample)
    for segments in out.values():
        segments.sort(key=lambda s: s.segment_index or 0)
    return out
