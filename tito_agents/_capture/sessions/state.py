"""What a token-in session remembers and what its plan decides: plain records, no I/O.

A `Session` holds the turns of one (episode, agent) and what was learnt about the server and its
template; the capture layer keeps one per (episode, agent) (`tito_agents._capture.session_store`).
`SessionDecision` is what `plan` returns for a request.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_agents._capture.sessions.reasons import FallbackReason
from tito_agents.calls import IdArray, SessionNote


@dataclass(slots=True)
class Turn:
    """One answered request of a session."""

    messages: list[Any]
    tools_key: bytes
    prompt_ids: IdArray
    sampled_ids: IdArray
    finish_reason: str | None
    assistant: Mapping[str, Any] | None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class SessionDecision:
    """What the request plan decided: the token prompt to send (or None) and the note.

    `reason`: the text written on the call (`Call.session_reason`); `fallback`: its cause where
    the server renders the prompt (`SessionNote.FALLBACK`).
    """

    prompt_ids: IdArray | None
    note: SessionNote
    reason: str | None = None
    fallback: FallbackReason | None = None

    @classmethod
    def falls_back(cls, cause: FallbackReason, detail: str | None = None) -> SessionDecision:
        """The server renders the prompt, for `cause` (`detail`: what is specific to the call)."""
        return cls(None, SessionNote.FALLBACK, cause.explain(detail), cause)


@dataclass(frozen=True, slots=True)
class EndOfTurn:
    """What the server's template ends an assistant turn with: `token`, or None and `missing`
    (why there is no usable token; every append of such a session falls back with it)."""

    token: int | None
    missing: FallbackReason | None = None


@dataclass(frozen=True, slots=True)
class TailCheck:
    """What the first check of one kind of tail found (a template property, shared by sessions).

    `ends_before`: how many end-of-turn tokens precede the delta in the short tail render, or None
    where the short render does not give the same delta (the whole conversation is rendered then).
    `preserves_prefix`: False where the template re-renders earlier turns once these messages are
    appended; `reason` then says how and what fixes it (token-in only with `SessionHistoryMode.SAMPLED`).
    """

    ends_before: int | None
    preserves_prefix: bool = True
    reason: str | None = None


@dataclass(slots=True)
class Session:
    """The turns of one (episode, agent) and what was learnt about the server."""

    turns: list[Turn] = field(default_factory=list)
    end_of_turn_id: int | None = None
    """Given, derived from the template, or (where the template could not be rendered for that)
    learnt from the first turn that ends on EOS."""
    end_of_turn_missing: FallbackReason | None = None
    """Why the server's template has no usable end-of-turn token (derived)."""
    end_of_turn_checked: bool = False
    """The token was given or derivation ran: not derived again in this session."""
    server_ignores_token_in: bool = False
    verified: dict[tuple[Any, ...], TailCheck] = field(default_factory=dict)
    """Appended-tail kinds (server, model, roles, tools) checked with the first check's renders. A
    template property, so the collector shares one dict between all sessions."""
    learnt_eos: int | None = None
    """The EOS the first turn that stopped ended on (a stand-in where derivation is inconclusive)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.end_of_turn_id is not None:
            self.end_of_turn_checked = True

    def add_turn(self, turn: Turn) -> None:
        with self.lock:
            self.turns.append(turn)
            ended_on_eos = turn.finish_reason in ("stop", "tool_calls") and turn.stop_reason is None
            if ended_on_eos and turn.sampled_ids.shape[0] and self.learnt_eos is None:
                # with no stop string or stop token, a turn that stopped ended on the model's EOS;
                # used only until (or where) the template gives the token
                self.learnt_eos = int(turn.sampled_ids[-1])

    def known_end_of_turn(self, known: EndOfTurn) -> None:
        """Take the end-of-turn of this server and model (derived here or by another session)."""
        self.end_of_turn_checked = True
        self.end_of_turn_id, self.end_of_turn_missing = known.token, known.missing

    def end_of_turn(self) -> EndOfTurn | None:
        """What this session knows to cache for its server and model (None: nothing derived)."""
        if not self.end_of_turn_checked:
            return None
        if self.end_of_turn_id is None and self.end_of_turn_missing is None:
            return None  # derivation was inconclusive
        return EndOfTurn(self.end_of_turn_id, self.end_of_turn_missing)

    def end_of_turn_token(self) -> int | None:
        """The token that ends a turn: known from the template (or given), else the EOS a turn
        that stopped ended on; None when neither is known."""
        return self.end_of_turn_id if self.end_of_turn_id is not None else self.learnt_eos
