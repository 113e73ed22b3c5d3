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
    A call labelled `role="summarizer"` or `role="summariser"` (`tito_agents.labels(role=...)`, or
    set by an integration: the LangChain adapter labels `SummarizationMiddleware`'s model call) must
    run under the same agent as the calls it summarises: it is a segment of that agent's trajectory,
    trained with the episode's reward like every other segment, and its span's `role` says
    "summarizer" (`SUMMARIZER_ROLE`, whichever spelling the label used). An unlabelled call is
    recognised as a summariser when a later rewritten prompt of the agent quotes what it sampled
    (its span's role then says "summarizer" too).

Quoted summaries
    A summary comes back inside another message, usually with words around it ("Summary so far:
    ..."), so the engine re-tokenizes it: the first word takes the prefix's space, the last
    punctuation merges with what follows, and the end-of-turn id is gone. A quote is therefore
    the summary's ids less up to `EDGE_IDS` at each end (at least `MIN_SUMMARY_IDS` kept), found in
    the new prompt; failing that, with a `decode`, its text found in the decoded prompt. The same
    ids right after the assistant turn's opening are a kept answer, not a quote: an unlabelled
    summary replayed as a whole assistant message looks like one, so label such a summariser.
    Recognition only classifies: the training ids are always the ids the engine sampled.

Rewrite kinds (`Sample.rewrite`), first match wins, for a segment that is not a resample, a branch,
a policy switch or a summarising call itself:

* "summary": a summarising call of the agent ran since the history was last extended (a call
  labelled so, or one the new prompt quotes after the rewrite point);
* "completion_truncated": `DivergenceKind.TRUNCATION`;
* "reasoning_cleared": `TEMPLATE_RERENDER` and the old history after the rewrite point held a
  reasoning block (`<think>…</think>`, …; needs `decode`);
* "rerendered": other template re-renders and `RETOKENIZED` (same text, other ids);
* "prefix_truncated": the new prompt continues with a later part of the old history (messages
  removed, the rest kept);
* "message_edited": `HISTORY_REWRITE` or `OTHER` otherwise (a message was changed).

Cost: each test looks at the bounded window the classifier already uses
(`divergence.TEXT_WINDOW_TOKENS`); finding summary ids in a prompt is a few byte searches, and the
text fallback decodes the summary and a bounded window of the prompt.
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

__all__ = [
    "SUMMARIZER_SPELLINGS",
    "call_role",
    "contains_ids",
    "link_segments",
    "rewrite_kind",
    "segment_rewrite",
]

SUMMARIZER_SPELLINGS = frozenset({SUMMARIZER_ROLE, "summariser"})
"""Role labels that mark a summarising call (compared case-insensitively); its span says
`SUMMARIZER_ROLE` whichever was used."""
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
"""A completion shorter than this is never taken for a summary by its ids alone, and a quote keeps
at least this many of its ids."""
EDGE_IDS = 3
"""Ids at each end of a summary that its quote inside another message may tokenize differently
(the first word joined to a prefix's space, the last punctuation merged with what follows, an
end-of-turn id the options do not name)."""


def call_role(call: Call) -> str | None:
    """The call's role label (`ROLE_LABEL`), when it is a string; either spelling of the summariser
    role (`SUMMARIZER_SPELLINGS`) reads as `SUMMARIZER_ROLE`."""
    role = call.labels.get(ROLE_LABEL) if call.labels else None
    if not isinstance(role, str):
        return None
    return SUMMARIZER_ROLE if role.casefold() in SUMMARIZER_SPELLINGS else role


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
    def special_ids(self) -> frozenset[int]: ...

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
    summarized, inferred = summarizer_before(call, latest.calls[-1], singles, new_tail, options)
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
    candidates: Sequence[Call],
    new_tail: IdArray,
    options: _Options,
) -> tuple[bool, str | None]:
    """Whether a summarising call ran before `call` rewrote its history, and the id of an
    unlabelled one recognised by its quote (None when one was labelled, or none ran).

    `new_tail` is `call`'s prompt after the rewrite point. `recent` is the agent's call just
    before `call`; `candidates` are the single-call segments
    made since the parent segment's last call (a summariser's own request extends no history),
    the parent excluded: its last answer may be kept verbatim by a plain truncation. When
    `recent` is labelled, the rewrite is a summary wherever the summary went. A candidate that
    `recent`'s prompt quotes already is a summary the history kept, not this rewrite's."""
    if call_role(call) == SUMMARIZER_ROLE:
        return False, None  # the summarising call itself
    if call_role(recent) == SUMMARIZER_ROLE:
        return True, None
    point = int(call.prompt_ids.shape[0] - new_tail.shape[0])
    prompt, before = _Prompt(call.prompt_ids, point), _Prompt(recent.prompt_ids, point)
    for candidate in candidates:
        quote = summary_quote(prompt, candidate, options)
        if quote is None:
            continue
        if candidate.call_id != recent.call_id and before.holds(quote, options.decode):
            continue  # the summary of an earlier rewrite, kept in the history
        return True, candidate.call_id
    return False, None


_Quote = IdArray | str
"""What a prompt holds of a summary: its ids less some edge ids, or its text."""


class _Prompt:
    """A prompt and the rewrite point around which a quote is looked for as text, decoded (a
    bounded window) at most once."""

    __slots__ = ("_text", "ids", "point")

    def __init__(self, ids: IdArray, point: int) -> None:
        self.ids = ids
        self.point = point
        self._text: str | None = None

    def after(self, n: int) -> IdArray:
        """The ids where an `n`-id quote may sit: it ends after the rewrite point (it may straddle
        it), and the assistant turn's opening before it is included (replays are told by it)."""
        return self.ids[max(0, self.point - n - _HEADER_IDS + 1) :]

    def text(self, decode: Decode) -> str:
        """The decoded window where a quote is looked for as text: `TEXT_WINDOW_TOKENS` ids on
        each side of the rewrite point."""
        if self._text is None:
            start = max(0, self.point - TEXT_WINDOW_TOKENS)
            self._text = decode(self.ids[start : self.point + TEXT_WINDOW_TOKENS].tolist())
        return self._text

    def holds(self, quote: _Quote, decode: Decode | None) -> bool:
        """Whether this prompt holds `quote` too."""
        if not isinstance(quote, str):
            return contains_ids(self.ids, quote)
        if decode is None:
            return False
        try:
            return quote in self.text(decode)
        except Exception:  # a user-supplied decode: diagnostics must not lose the samples
            return False


def summary_quote(prompt: _Prompt, candidate: Call, options: _Options) -> _Quote | None:
    """What `prompt` quotes of `candidate`'s completion inside a message (module docstring,
    "Quoted summaries"); None when it quotes none of it, or replays it as an assistant turn."""
    ids = summary_ids(candidate, options.eos_ids)
    n = int(ids.shape[0])
    if n < MIN_SUMMARY_IDS:
        return None
    header = candidate.prompt_ids[-_HEADER_IDS:]
    window = prompt.after(n)
    for head, tail in _edge_cuts(n):
        core = ids[head : n - tail]
        if contains_ids(window, core):
            # right after the assistant turn's opening it is an answer kept in the history
            replayed = contains_ids(window, np.concatenate((header, ids[: n - tail])))
            return None if replayed else core
    return _text_quote(prompt, ids, header, options)


def _edge_cuts(n: int) -> Iterable[tuple[int, int]]:
    """Ids to drop at the (start, end) of an `n`-id summary, fewest first, keeping at least
    `MIN_SUMMARY_IDS`."""
    for total in range(2 * EDGE_IDS + 1):
        if n - total < MIN_SUMMARY_IDS:
            return
        for head in range(max(0, total - EDGE_IDS), min(total, EDGE_IDS) + 1):
            yield head, total - head


def _text_quote(prompt: _Prompt, ids: IdArray, header: IdArray, options: _Options) -> str | None:
    """`summary_quote` on text, with a `decode`: for a quote whose ids differ inside too (a
    completion sampled in ids the tokenizer would not choose for its text)."""
    decode = options.decode
    if decode is None:
        return None
    special = options.special_ids
    try:
        summary = decode([i for i in ids.tolist() if i not in special]).strip()
        window = prompt.text(decode)
        opening = decode(header.tolist())
    except Exception:  # a user-supplied decode: diagnostics must not lose the episode's samples
        return None
    if not summary or summary not in window or opening + summary in window:
        return None
    return summary


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
