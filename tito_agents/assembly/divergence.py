"""Divergences: the record of where a merged sample split, its kinds, and the classifier that
says why a prompt stopped extending an agent's history.

A merged sample grows while each call's `prompt_ids` start with the previous call's prompt + sampled
ids. When a prompt does not, the first position where it differs from that sequence is the *rewrite
point*; this module names the cause. Classification is diagnostics only: it never changes which token
ids are trained. A `decode` callable (a tokenizer's decode) is used to compare texts and write excerpts,
never to produce token ids.

Rules, first match wins (the assembler decides `RESAMPLE` and `BRANCH` before calling
`classify_rewrite`, which needs neither chain structure nor timing):

1. `RESAMPLE`: the prompt equals the prompt of an earlier call of the agent (retry, `n > 1`).
2. `BRANCH`: the call was sent before the call it would extend had returned (`started_at <
   ended_at`) and the rewrite point is not inside that call's sampled ids (a parallel sub-call).
3. `TRUNCATION`: the rewrite point lies in the last call's sampled ids, which ended on
   `finish_reason == "length"` without an end-of-turn id (`eos_ids`, when given).
4. `RETOKENIZED` (needs `decode`): the old tail (history after the rewrite point) decodes to a prefix
   of the new tail's text: same text, other ids.
5. `TEMPLATE_RERENDER`: texts equal once reasoning blocks (`<think>…</think>`, …), special-token
   strings and whitespace are removed (needs `decode`); or, ids only (needs `special_ids`), the tails
   equal once special ids are removed, or once a special-delimited block at the rewrite point (e.g. a
   dropped reasoning block) is skipped.
6. `HISTORY_REWRITE`: the rewrite point lies before the last call's sampled ids (an earlier message
   was changed or removed).
7. `OTHER`: the last call's sampled ids were rewritten in a way none of the above explains (without
   `decode` this includes retokenization drift, which only text can tell).
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.calls import IdArray

Decode = Callable[[Sequence[int]], str]
"""A tokenizer's decode: ids to text. Used for classification and excerpts only."""

TEXT_WINDOW_TOKENS = 2048
"""How many ids after the rewrite point are compared (as text or ids); longer tails compare on this
window, which keeps classification O(window) however long the history."""
_CUT_MARGIN_CHARS = 16
_NEW_MARGIN_CHARS = 64
_EXCERPT_TOKENS = 8
_EXCERPT_CHARS = 80

_REASONING_BLOCK = re.compile(r"<(think|thinking|reasoning|thought)>.*?</\1>", flags=re.DOTALL)
_UNCLOSED_REASONING = re.compile(
    r"<(think|thinking|reasoning|thought)>(?:(?!</\1>).)*\Z", flags=re.DOTALL
)
_MARKER_TOKEN = re.compile(r"<\|[^<>|\s]{1,64}\|>")
_WHITESPACE = re.compile(r"\s+")


class DivergenceKind(enum.Enum):
    """Why a call's prompt does not extend the sequence its agent built so far."""

    RETOKENIZED = "retokenized"
    """Same text, different ids: the sampled ids were re-encoded canonically (wire format §11)."""
    TEMPLATE_RERENDER = "template_rerender"
    """Only template or special tokens differ (a dropped reasoning block, changed glue)."""
    HISTORY_REWRITE = "history_rewrite"
    """Earlier messages were changed or removed (memory trimming, summarisation, edits)."""
    TRUNCATION = "truncation"
    """The previous completion hit `length` without an end-of-turn id and was re-rendered."""
    RESAMPLE = "resample"
    """The same prompt was sampled again (retry, `n > 1`): sibling samples, both kept."""
    BRANCH = "branch"
    """A parallel sub-call: sent before the call it would extend had returned."""
    OTHER = "other"
    """The last completion was rewritten for a reason the ids (and text) cannot tell."""
    POLICY_SWITCH = "policy_switch"
    """The prompt extends the history, but the call went to another policy (`Call.policy`, a
    `Collector(policies=...)` mapping changed mid-episode): a sample carries one policy, so the call
    starts a new one. Nothing was rewritten; the rewrite point is the whole old sequence."""


EPISODE_START = "episode_start"
"""`Sample.start_reason` of an agent's first merged sample."""
END = "end"
"""`Sample.end_reason` of a merged sample nothing diverged from after its last call."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where and why one call's prompt stopped extending its agent's history."""

    episode_id: str
    agent: str | None
    call_id: str
    """The call whose prompt diverged; it starts sample `sample_id`."""
    prev_call_id: str
    """The call it was compared with: the parent chain's last call, or for a resample the earlier
    call with the same prompt."""
    rewrite_point: int
    """Position in the new prompt where it differs from the parent's ids (for a resample: the
    prompt length, where the two samplings start)."""
    kind: DivergenceKind
    excerpt: str
    """Decoded tokens around the break, old vs new (ids when no decode was given)."""
    sample_id: str
    prev_sample_id: str
    """The sample holding `prev_call_id`; it keeps its trained ids."""
    rewrite: str | None = None
    """The kind of history rewrite (`Sample.rewrite` of sample `sample_id`), None when unknown."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (`kind` as its string value), as reports and logs store them."""
        return {
            "episode_id": self.episode_id,
            "agent": self.agent,
            "call_id": self.call_id,
            "prev_call_id": self.prev_call_id,
            "rewrite_point": self.rewrite_point,
            "kind": self.kind.value,
            "excerpt": self.excerpt,
            "sample_id": self.sample_id,
            "prev_sample_id": self.prev_sample_id,
            "rewrite": self.rewrite,
        }


def common_prefix_len(a: IdArray, b: IdArray) -> int:
    """The length of the longest common prefix of two id arrays (vectorised, O(min length))."""
    n = min(int(a.shape[0]), int(b.shape[0]))
    if n == 0:
        return 0
    mismatch = np.flatnonzero(a[:n] != b[:n])
    return int(mismatch[0]) if mismatch.size else n


def classify_rewrite(
    old_tail: IdArray,
    new_tail: IdArray,
    *,
    rewrite_point: int,
    last_start: int,
    last_end: int,
    last_finish_reason: str | None,
    last_sampled_ids: IdArray,
    decode: Decode | None = None,
    special_ids: frozenset[int] = frozenset(),
    eos_ids: frozenset[int] = frozenset(),
) -> DivergenceKind:
    """The kind of a divergence that is neither a resample nor a branch (rules 3 to 7 above).

    `old_tail` is the history after the rewrite point (the previous prompt + sampled ids),
    `new_tail` the new prompt after it; only their first `TEXT_WINDOW_TOKENS` ids (and whether there
    are more) matter. `last_start:last_end` is where the last call's sampled ids sit in the history.
    """
    if last_start <= rewrite_point < last_end and _truncated(
        last_finish_reason, last_sampled_ids, eos_ids
    ):
        return DivergenceKind.TRUNCATION
    if decode is not None:
        texts = _texts(old_tail, new_tail, decode)
        if texts is not None:
            old_text, new_text = texts
            if old_text and new_text.startswith(old_text):
                return DivergenceKind.RETOKENIZED
            try:
                specials = _special_strings(special_ids, decode)
            except TypeError:  # an unhashable decode callable: no memo
                specials = _special_strings.__wrapped__(special_ids, decode)
            if _normal_text_is_prefix(old_text, new_text, specials):
                return DivergenceKind.TEMPLATE_RERENDER
    if special_ids and _only_specials_differ(old_tail, new_tail, special_ids):
        return DivergenceKind.TEMPLATE_RERENDER
    if rewrite_point < last_start:
        return DivergenceKind.HISTORY_REWRITE
    return DivergenceKind.OTHER


def _truncated(finish_reason: str | None, sampled_ids: IdArray, eos_ids: frozenset[int]) -> bool:
    if finish_reason != "length":
        return False
    return not (eos_ids and sampled_ids.size and int(sampled_ids[-1]) in eos_ids)


def _texts(old_tail: IdArray, new_tail: IdArray, decode: Decode) -> tuple[str, str] | None:
    """Decoded old and new tails, the new one at least as long as the old text (plus a margin).

    At most `TEXT_WINDOW_TOKENS` old ids are decoded; a cut text loses a short margin (a cut can end
    mid-character or mid-block). The new window starts at the old one's size and doubles until its
    text is long enough. Returns None when `decode` fails: classification then uses ids only.
    """
    cut = old_tail.shape[0] > TEXT_WINDOW_TOKENS
    try:
        old_text = decode(old_tail[:TEXT_WINDOW_TOKENS].tolist())
        if cut:
            old_text = _UNCLOSED_REASONING.sub("", old_text[:-_CUT_MARGIN_CHARS])
        size = min(int(new_tail.shape[0]), int(min(old_tail.shape[0], TEXT_WINDOW_TOKENS)) + 64)
        while True:
            new_text = decode(new_tail[:size].tolist())
            if len(new_text) >= len(old_text) + _NEW_MARGIN_CHARS or size >= new_tail.shape[0]:
                break
            size = min(int(new_tail.shape[0]), 2 * size)
    except Exception:  # a user-supplied decode: diagnostics must not lose the episode's samples
        return None
    return old_text, new_text


@functools.lru_cache(maxsize=8)
def _special_strings(special_ids: frozenset[int], decode: Decode) -> tuple[str, ...]:
    strings = []
    for token_id in sorted(special_ids):
        try:
            text = decode([token_id])
        except Exception:  # same reason as in _texts
            continue
        if text.strip():
            strings.append(text)
    # Longest first, so `</think>` is removed before a shorter string it contains.
    return tuple(sorted(strings, key=len, reverse=True))


def has_reasoning_block(text: str) -> bool:
    """Whether `text` holds a reasoning block (`<think>…</think>`, …; an unclosed one counts)."""
    return bool(_REASONING_BLOCK.search(text) or _UNCLOSED_REASONING.search(text))


def normalize_template_text(text: str, special_strings: Sequence[str] = ()) -> str:
    """Text with reasoning blocks, special-token strings and all whitespace removed."""
    text = _REASONING_BLOCK.sub("", text)
    for special in special_strings:
        text = text.replace(special, "")
    text = _MARKER_TOKEN.sub("", text)
    return _WHITESPACE.sub("", text)


def _normal_text_is_prefix(old_text: str, new_text: str, specials: Sequence[str]) -> bool:
    """Whether the old text, normalised, is a prefix of the new text, normalised."""
    return normalize_template_text(new_text, specials).startswith(
        normalize_template_text(old_text, specials)
    )


def _only_specials_differ(
    old_tail: IdArray, new_tail: IdArray, special_ids: frozenset[int]
) -> bool:
    """Ids-only template check: equal once special ids (or one special-delimited block) are dropped."""
    specials: npt.NDArray[np.int64] = np.fromiter(
        special_ids, dtype=np.int64, count=len(special_ids)
    )
    old = _strip(old_tail[:TEXT_WINDOW_TOKENS], specials)
    new = _strip(new_tail[: 2 * TEXT_WINDOW_TOKENS], specials)
    if _is_prefix(old, new):
        return True
    # A block opened by a special id at the rewrite point and closed by the next special id, dropped
    # (or added) by the re-render: `<think> … </think>` when the user lists those ids as special.
    old_rest = _after_special_block(old_tail[:TEXT_WINDOW_TOKENS], specials)
    if old_rest is not None and _is_prefix(_strip(old_rest, specials), new):
        return True
    new_rest = _after_special_block(new_tail[: 2 * TEXT_WINDOW_TOKENS], specials)
    return new_rest is not None and _is_prefix(old, _strip(new_rest, specials))


def _after_special_block(ids: IdArray, specials: npt.NDArray[np.int64]) -> IdArray | None:
    """The ids after a block that starts with a special id and ends at the next one; None if none."""
    if ids.size == 0 or not _is_special(ids[:1], specials)[0]:
        return None
    closers = np.flatnonzero(_is_special(ids[1:], specials))
    if closers.size == 0:
        return None
    return ids[int(closers[0]) + 2 :]


def _is_special(ids: IdArray, specials: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which ids are special: a few equality passes for the usual handful, `isin` for many."""
    if specials.shape[0] > 32:
        return np.isin(ids, specials)
    mask = np.zeros(ids.shape[0], dtype=np.bool_)
    for special in specials.tolist():
        mask |= ids == special
    return mask


def _strip(ids: IdArray, specials: npt.NDArray[np.int64]) -> IdArray:
    kept: IdArray = ids[~_is_special(ids, specials)]
    return kept


def _is_prefix(prefix: IdArray, ids: IdArray) -> bool:
    n = int(prefix.shape[0])
    return n <= ids.shape[0] and bool(np.array_equal(ids[:n], prefix))


def excerpt(
    prompt_ids: IdArray,
    rewrite_point: int,
    old_ids: IdArray,
    new_ids: IdArray,
    decode: Decode | None = None,
) -> str:
    """A short human-readable view of a break: the context before it, then old vs new.

    `old_ids` / `new_ids` start at the rewrite point (for a resample: the two sampled sequences).
    With `decode`, text (repr-quoted so newlines show); else the ids.
    """
    before = prompt_ids[max(0, rewrite_point - _EXCERPT_TOKENS) : rewrite_point]
    old = old_ids[: 2 * _EXCERPT_TOKENS]
    new = new_ids[: 2 * _EXCERPT_TOKENS]
    if decode is not None:
        try:
            parts = [decode(x.tolist()) for x in (before, old, new)]
        except Exception:  # same reason as in _texts: fall back to the ids
            parts = None
        if parts is not None:
            shown = [repr(p[-_EXCERPT_CHARS:]) for p in parts[:1]]
            shown += [repr(p[:_EXCERPT_CHARS]) for p in parts[1:]]
            return f"@{rewrite_point} …{shown[0]} | old: {shown[1]} | new: {shown[2]}"
    return f"@{rewrite_point} …{before.tolist()} | old: {old.tolist()} | new: {new.tolist()}"
