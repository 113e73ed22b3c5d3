"""The request plan of a token-in session: named steps from a chat request to a `SessionDecision`.

`plan` reads as the list of what must hold for a token prompt, in order; each step decides one
thing and either returns what it found or falls back (raises `_FallBack` with the
`FallbackReason`, which `plan` returns as the decision). The one I/O step, the `/tokenize`
renders, is a `yield`: the sync and async transports drive the same steps with their own I/O.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import orjson

from tito_agents._capture.sessions.history import find_parent, tools_key
from tito_agents._capture.sessions.reasons import FallbackReason
from tito_agents._capture.sessions.renders import (
    TAIL_HEAD,
    TokenizeResults,
    derive_end_of_turn,
    end_of_turn_renders,
    not_preserved,
    tail_ends_before,
)
from tito_agents._capture.sessions.state import Session, SessionDecision, TailCheck, Turn
from tito_agents.calls import IdArray, SessionNote
from tito_agents.config import SessionHistoryMode

TokenizeRequests = list[dict[str, Any]]
Plan = Generator[TokenizeRequests, TokenizeResults, SessionDecision]

_SAMPLED_NOTE = (
    "the template would re-render the history differently; the model's sampled tokens were kept "
    "(session_history='sampled')"
)


def plan(
    session: Session,
    payload: dict[str, Any],
    server: str = "",
    history: SessionHistoryMode = SessionHistoryMode.TEMPLATE,
) -> Plan:
    """Decide the token prompt of a chat request in session mode (see `tito_agents.sessions`).

    `server` names the server the request goes to (tail kinds are checked per server); `history`
    says whether a template that re-renders history differently falls back (`TEMPLATE`) or keeps
    the sampled tokens (`SAMPLED`). Yields lists of `/tokenize` payloads; receives, for each, the
    token list or None on failure.
    """
    try:
        return (yield from _plan(session, payload, server, history))
    except _FallBack as fallback:
        return fallback.decision


def _plan(
    session: Session, payload: dict[str, Any], server: str, history: SessionHistoryMode
) -> Plan:
    """The steps in order: what the request and the session allow, the renders, the new tokens,
    the token prompt. A step that finds the server must render the request raises `_FallBack`."""
    messages = _messages(payload)
    if not session.turns:
        return SessionDecision(None, SessionNote.FIRST)
    _check_token_prompt_allowed(session, payload)
    key = tools_key(payload)
    parent, repeat = _parent(session, messages, key)
    if repeat:
        return SessionDecision(parent.prompt_ids, SessionNote.RESAMPLE)
    _check_end_of_turn_usable(session)
    append = _Append.of(payload, messages, parent, key, server)
    checked = _known_kind(session, append, history)
    derive = [] if session.end_of_turn_checked else end_of_turn_renders(append.untooled, messages)
    results = yield [*derive, *_renders_needed(append, checked)]
    results = _learn_end_of_turn(session, results, len(derive))
    ends = _TurnEnds.of(session, parent)
    if checked is not None:
        delta, preserved = _delta_of_known_kind(session, append, checked, results, ends)
    else:
        delta, preserved = _delta_of_first_check(session, append, results, ends, history)
    return _token_prompt(parent, ends, delta, preserved)


class _FallBack(Exception):
    """A step found that the server must render this request: `plan` returns `decision`."""

    def __init__(self, decision: SessionDecision) -> None:
        super().__init__(decision.reason)
        self.decision = decision


def _fall_back(cause: FallbackReason, detail: str | None = None) -> NoReturn:
    raise _FallBack(SessionDecision.falls_back(cause, detail))


# ---- what the request and the session allow ----


def _messages(payload: Mapping[str, Any]) -> list[Any]:
    """The request's chat messages (a request without any has nothing to append to)."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        _fall_back(FallbackReason.NO_MESSAGES)
    return messages


def _check_token_prompt_allowed(session: Session, payload: Mapping[str, Any]) -> None:
    """The server honours token prompts (as far as the session saw) and the request is an
    ordinary generation (not an echo or the continuation of its final message)."""
    if session.server_ignores_token_in:
        _fall_back(FallbackReason.SERVER_IGNORES_TOKEN_PROMPT)
    if payload.get("echo") or payload.get("continue_final_message"):
        _fall_back(FallbackReason.ECHO_OR_CONTINUE)


def _parent(session: Session, messages: list[Any], key: bytes) -> tuple[Turn, bool]:
    """The turn the request (with tools `key`) appends to, and whether it repeats that turn's
    request exactly."""
    found = find_parent(session, messages, key)
    if found is None:
        _fall_back(FallbackReason.NOT_APPEND_ONLY)
    return found


def _check_end_of_turn_usable(session: Session) -> None:
    """The template has a usable end-of-turn token (unless not derived yet)."""
    if session.end_of_turn_missing is not None:
        _fall_back(session.end_of_turn_missing)


# ---- the renders that find the new tokens ----


@dataclass(slots=True)
class _Append:
    """A request that appends new messages to `parent`: the `/tokenize` payloads that find their
    tokens, and the kind of tail appended (`shape`: what a `TailCheck` is kept for)."""

    parent: Turn
    shape: tuple[Any, ...]
    roles: tuple[str, ...]
    """The roles of the new messages."""
    untooled: dict[str, Any]
    """The request's rendering options (model, its own template), without tools."""
    before: dict[str, Any]
    """The conversation up to the previous assistant turn, without a generation prompt."""
    whole: dict[str, Any]
    """The whole request."""
    tail: dict[str, Any]
    """The short render: a fixed head, the previous assistant message and the new messages,
    without tools (its cost does not grow with the conversation)."""

    @classmethod
    def of(
        cls, payload: Mapping[str, Any], messages: list[Any], parent: Turn, key: bytes, server: str
    ) -> _Append:
        known = len(parent.messages)
        common: dict[str, Any] = {}
        if payload.get("tools"):
            common["tools"] = payload["tools"]
        for option in ("chat_template", "chat_template_kwargs"):  # the request's own template
            if payload.get(option):
                common[option] = payload[option]
        if payload.get("model"):
            common["model"] = payload["model"]
        untooled = {key: value for key, value in common.items() if key != "tools"}
        generation_prompt = payload.get("add_generation_prompt", True) is not False
        roles = tuple(str(m.get("role")) for m in messages[known + 1 :] if isinstance(m, Mapping))
        shape = (
            server,
            str(payload.get("model")),
            roles,
            key,
            orjson.dumps(payload.get("chat_template_kwargs")),
            str(payload.get("chat_template")),
        )
        return cls(
            parent=parent,
            shape=shape,
            roles=roles,
            untooled=untooled,
            before={**common, "messages": messages[: known + 1], "add_generation_prompt": False},
            whole={**common, "messages": messages, "add_generation_prompt": generation_prompt},
            tail={
                **untooled,
                "messages": [TAIL_HEAD, *messages[known:]],
                "add_generation_prompt": generation_prompt,
            },
        )


def _known_kind(session: Session, append: _Append, history: SessionHistoryMode) -> TailCheck | None:
    """What an earlier check of this kind of tail found (None: not checked yet); a kind whose
    template re-renders the history falls back at once unless sampled history is kept."""
    checked = session.verified.get(append.shape)
    if (
        checked is not None
        and not checked.preserves_prefix
        and history is SessionHistoryMode.TEMPLATE
    ):
        cause = FallbackReason.PREFIX_NOT_PRESERVED
        raise _FallBack(SessionDecision(None, SessionNote.FALLBACK, checked.reason, cause))
    return checked


def _renders_needed(append: _Append, checked: TailCheck | None) -> list[dict[str, Any]]:
    """The first check of a kind renders before, whole and tail; a checked kind only the short
    tail where it stands in, else the whole conversation."""
    if checked is None:
        return [append.before, append.whole, append.tail]
    return [append.tail] if checked.ends_before is not None else [append.whole]


def _learn_end_of_turn(session: Session, results: TokenizeResults, derived: int) -> TokenizeResults:
    """Take the end-of-turn token from the first `derived` renders (if any were asked for);
    returns the other renders."""
    if not derived:
        return results
    found = derive_end_of_turn(results[:derived])
    if found is not None:
        session.known_end_of_turn(found)
    else:  # inconclusive: the EOS of a turn that stopped stands in, as before derivation
        session.end_of_turn_checked = True
        session.end_of_turn_id = session.learnt_eos
    _check_end_of_turn_usable(session)
    return results[derived:]


@dataclass(slots=True)
class _TurnEnds:
    """The end-of-turn token and how many the conversation holds up to the previous turn."""

    token: int
    bridged: bool
    """The previous turn did not end with the token (cut by length, a stop string): the token is
    added after its sampled ids as context."""
    so_far: int
    """End-of-turn tokens of the conversation up to the previous assistant turn, bridge included."""

    @classmethod
    def of(cls, session: Session, parent: Turn) -> _TurnEnds:
        token = session.end_of_turn_token()
        if token is None:
            _fall_back(FallbackReason.END_OF_TURN_UNKNOWN)
        sampled = parent.sampled_ids
        bridged = not (sampled.shape[0] and int(sampled[-1]) == token)
        so_far = int(np.count_nonzero(parent.prompt_ids == token))
        so_far += int(np.count_nonzero(sampled == token)) + int(bridged)
        return cls(token, bridged, so_far)


# ---- the new tokens ----


def _delta_of_known_kind(
    session: Session,
    append: _Append,
    checked: TailCheck,
    results: TokenizeResults,
    ends: _TurnEnds,
) -> tuple[IdArray, bool]:
    """The new tokens of a checked kind of tail, from its one render: the short render cut after
    the end-of-turn tokens of its head and of the previous assistant turn, or the whole render
    after as many as the conversation so far holds. A cut that does not fit forgets the kind."""
    (rendered,) = results
    if rendered is None:
        _fall_back(FallbackReason.TOKENIZE_FAILED)
    tokens = np.asarray(rendered, dtype=np.int32)
    ends_before = checked.ends_before if checked.ends_before is not None else ends.so_far
    positions = np.flatnonzero(tokens == ends.token)
    if positions.shape[0] < ends_before or ends_before == 0:
        session.verified.pop(append.shape, None)
        _fall_back(FallbackReason.FEWER_TURNS)
    return tokens[int(positions[ends_before - 1]) + 1 :], checked.preserves_prefix


def _delta_of_first_check(
    session: Session,
    append: _Append,
    results: TokenizeResults,
    ends: _TurnEnds,
    history: SessionHistoryMode,
) -> tuple[IdArray, bool]:
    """The new tokens from the first check's renders (the whole render past the previous
    assistant turn), and whether the template preserved the prefix; what was found is kept for
    the kind."""
    rendered_before, rendered_whole, rendered_tail = results
    if rendered_before is None or rendered_whole is None:
        _fall_back(FallbackReason.TOKENIZE_FAILED)
    before = np.asarray(rendered_before, dtype=np.int32)
    whole = np.asarray(rendered_whole, dtype=np.int32)
    positions = _previous_turn_ends(before, ends)
    cut = int(positions[-1]) + 1
    reason = None
    if whole.shape[0] >= cut and np.array_equal(before[:cut], whole[:cut]):
        delta = whole[cut:]
    else:
        reason = not_preserved(before, whole, positions, append.roles)
        delta = _delta_keeping_sampled(session, append, whole, ends, reason, history)
    with session.lock:
        check = TailCheck(
            tail_ends_before(rendered_tail, delta, ends.token), reason is None, reason
        )
        session.verified[append.shape] = check
    return delta, reason is None


def _previous_turn_ends(before: IdArray, ends: _TurnEnds) -> np.ndarray[Any, Any]:
    """Where the render up to the previous assistant turn has its end-of-turn tokens: exactly as
    many as the conversation so far holds (so its last one ends the previous turn)."""
    positions = np.flatnonzero(before == ends.token)
    if positions.size == 0:
        _fall_back(FallbackReason.NO_END_OF_TURN_RENDERED)
    if positions.size != ends.so_far:
        _fall_back(
            FallbackReason.TURN_COUNT_MISMATCH,
            f" ({positions.size} where it holds {ends.so_far}: a message contains the token, or "
            "the template drops or merges turns)",
        )
    return positions


def _delta_keeping_sampled(
    session: Session,
    append: _Append,
    whole: IdArray,
    ends: _TurnEnds,
    reason: str,
    history: SessionHistoryMode,
) -> IdArray:
    """Where the template re-renders the history: fall back (and remember the kind), or, with
    `SessionHistoryMode.SAMPLED`, the whole render cut after the conversation's turn ends."""
    if history is SessionHistoryMode.TEMPLATE:
        with session.lock:
            session.verified[append.shape] = TailCheck(None, False, reason)
        cause = FallbackReason.PREFIX_NOT_PRESERVED
        raise _FallBack(SessionDecision(None, SessionNote.FALLBACK, reason, cause))
    positions = np.flatnonzero(whole == ends.token)
    if positions.shape[0] < ends.so_far:
        _fall_back(FallbackReason.FEWER_TURNS)
    return whole[int(positions[ends.so_far - 1]) + 1 :]


def _token_prompt(
    parent: Turn, ends: _TurnEnds, delta: IdArray, preserved: bool
) -> SessionDecision:
    """previous prompt + previous sampled ids [+ end-of-turn bridge] + new tokens, with the note."""
    pieces = [parent.prompt_ids, parent.sampled_ids]
    if ends.bridged:
        pieces.append(np.array([ends.token], dtype=np.int32))
    pieces.append(delta)
    prompt = np.concatenate(pieces).astype(np.int32, copy=False)
    notes = []
    if ends.bridged:
        notes.append(
            f"previous turn ended with finish_reason={parent.finish_reason!r}, without the "
            "end-of-turn token: the token was added as context"
        )
    if not preserved:
        notes.append(_SAMPLED_NOTE)
        return SessionDecision(prompt, SessionNote.TOKEN_IN_SAMPLED, "; ".join(notes))
    if ends.bridged:
        return SessionDecision(prompt, SessionNote.TOKEN_IN_BRIDGED, notes[0])
    return SessionDecision(prompt, SessionNote.TOKEN_IN)
