"""What the server's chat template does, read from its own `/tokenize` renders (no tokenizer).

Three findings, each a template property: the token that ends an assistant turn
(`end_of_turn_renders` / `derive_end_of_turn`), where a template that does not preserve the
prefix re-renders the history (`not_preserved`), and whether the short tail render gives the same
new tokens as the whole conversation (`tail_ends_before`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tito_agents._capture.sessions.reasons import FallbackReason
from tito_agents._capture.sessions.state import EndOfTurn
from tito_agents.calls import IdArray

TokenizeResults = list[list[int] | None]
"""What the transport hands back for a plan's `/tokenize` payloads: token lists, None on failure."""

TAIL_HEAD: dict[str, str] = {"role": "user", "content": "."}
"""The fixed first message of the short tail render (many templates expect a user turn first)."""

END_OF_TURN_PROBES = ("1", "2", "1.")
"""Assistant texts of the derivation renders: two that differ in one token (the common suffix
after them is what the template writes after a turn), and one that ends on punctuation, which
merges with a marker that is text rather than one token of the served tokenizer."""


def end_of_turn_renders(common: Mapping[str, Any], messages: list[Any]) -> list[dict[str, Any]]:
    """The `/tokenize` payloads `derive_end_of_turn` reads: a tiny conversation (the request's
    system message if it opens with one, a fixed user turn, an assistant turn) per probe text."""
    head: list[Any] = [TAIL_HEAD]
    first = messages[0] if messages else None
    if isinstance(first, Mapping) and first.get("role") == "system":
        head = [first, TAIL_HEAD]
    return [
        {
            **common,
            "messages": [*head, {"role": "assistant", "content": probe}],
            "add_generation_prompt": False,
        }
        for probe in END_OF_TURN_PROBES
    ]


def derive_end_of_turn(rendered: TokenizeResults) -> EndOfTurn | None:
    """The end-of-turn token of a template from the renders of `end_of_turn_renders`; None when
    the renders failed (the server refused them: inconclusive)."""
    if len(rendered) != len(END_OF_TURN_PROBES) or any(r is None for r in rendered):
        return None
    one, two, dotted = (np.asarray(r, dtype=np.int32) for r in rendered)
    after = _common_suffix(one, two)
    if after == 0:
        return EndOfTurn(None, FallbackReason.NO_END_OF_TURN_TOKEN)
    if _common_suffix(one, dotted) < after:
        return EndOfTurn(None, FallbackReason.END_OF_TURN_NOT_ONE_TOKEN)
    return EndOfTurn(int(one[one.shape[0] - after]))


def _common_suffix(a: IdArray, b: IdArray) -> int:
    """Length of the longest common suffix of two renders, not overlapping their common prefix."""
    n = min(a.shape[0], b.shape[0])
    prefix = int(np.argmax(a[:n] != b[:n])) if not np.array_equal(a[:n], b[:n]) else n
    room = n - prefix
    if room == 0:
        return 0
    tail_a, tail_b = a[a.shape[0] - room :][::-1], b[b.shape[0] - room :][::-1]
    differ = np.flatnonzero(tail_a != tail_b)
    return int(differ[0]) if differ.size else room


_FIX = (
    "Fix: serve a prefix-preserving template (`vllm serve --chat-template`; trl ships training "
    "templates for these families, e.g. trl/chat_templates/qwen3_training.jinja; `tito-agents "
    "audit-template` names the cause), or keep the model's sampled tokens in context with "
    "Collector(session_history='sampled')"
)


def not_preserved(
    before: IdArray, after: IdArray, ends: np.ndarray[Any, Any], roles: tuple[str, ...]
) -> str:
    """Why the first check failed, precisely (a `FallbackReason.PREFIX_NOT_PRESERVED` text):
    where the template re-renders the history. `before` / `after`: the renders up to the previous
    assistant turn and with the new messages; `ends`: the end-of-turn positions in `before`."""
    n = min(before.shape[0], after.shape[0])
    same = np.array_equal(before[:n], after[:n])
    first = n if same else int(np.argmax(before[:n] != after[:n]))
    turn_start = int(ends[-2]) + 1 if ends.shape[0] > 1 else 0
    appended = ",".join(roles)
    head = f" when appending [{appended}]: "
    if first >= turn_start:
        where = (
            f"it renders the previous assistant turn differently once [{appended}] follows (from "
            f"its token {first - turn_start}), as templates that drop past reasoning or an empty "
            "reasoning block do (stock Qwen3, DeepSeek-R1, GLM). "
        )
    else:
        where = (
            f"it re-renders an earlier turn (from token {first} of the conversation) once "
            f"[{appended}] follows (a system message or tool list that moves, numbered turns). "
        )
    return FallbackReason.PREFIX_NOT_PRESERVED.explain(head + where + _FIX)


def tail_ends_before(rendered_tail: list[int] | None, delta: IdArray, eot: int) -> int | None:
    """How many end-of-turn tokens precede `delta` in the short tail render, when that render ends
    with exactly `delta` right after an end-of-turn token; None when it cannot stand in."""
    if rendered_tail is None or delta.shape[0] == 0:
        return None
    r = np.asarray(rendered_tail, dtype=np.int32)
    head = r.shape[0] - delta.shape[0]
    if head < 1 or int(r[head - 1]) != eot or not np.array_equal(r[head:], delta):
        return None
    return int(np.count_nonzero(r[:head] == eot))
