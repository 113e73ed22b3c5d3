"""Token-in sessions: the server never re-tokenizes what the model sampled.

In session mode the capture layer keeps, per (episode, agent), the turns it has seen: the request
messages, the token prompt the server used, the ids it sampled and the assistant message it
returned. A later chat request that only appends to one of those turns (its messages = that turn's
messages + the assistant message that answered it + new messages) is turned into a token-in request:

    prompt = previous prompt ids + previous sampled ids [+ end-of-turn bridge] + delta

where `delta` are the tokens of the new messages, computed from the server's own chat template with
`/tokenize` (no local tokenizer): the conversation ending with the previous assistant turn (cut after
its end-of-turn token) and the same with the new messages and the generation prompt; the first must
be a prefix of the second. That check runs the first time each kind of tail (model, its roles, the
tools) is appended, together with a third, short render: a fixed one-message head, the previous
assistant message and the new messages, without tools. When that short render ends with exactly
the same delta, later tails of the same kind need only the short render (its cost does not grow with
the conversation, and tool schemas, which are slow to render, are left out); otherwise they need one
render of the whole conversation, cut after as many end-of-turn tokens as it already holds. A cut
that does not fit forgets the kind again, so the next tail of that kind is checked afresh. The prompt
goes to vLLM 0.32 as `kv_transfer_params.prompt_token_ids`, which replaces the rendered prompt
while `messages` still drive tool parsing, so the response stays an ordinary chat completion.

Anything else falls back to normal rendering for that call, with the reason recorded on the call
(`Call.session`): history that is not append-only, a template that does not preserve the prefix, a
server without `/tokenize` or one that ignored the token prompt. Sampled ids are never re-encoded.

The request side is a generator (`plan`) that yields the `/tokenize` payloads it needs and receives
their results, so the sync and async transports drive the same logic with their own I/O.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tito_agents.calls import IdArray, SessionNote

TokenizeRequests = list[dict[str, Any]]
TokenizeResults = list[list[int] | None]
Plan = Generator[TokenizeRequests, TokenizeResults, "SessionDecision"]


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
    """What the request plan decided: the token prompt to send (or None) and the note."""

    prompt_ids: IdArray | None
    note: SessionNote
    reason: str | None = None


@dataclass(slots=True)
class Session:
    """The turns of one (episode, agent) and what was learnt about the server."""

    turns: list[Turn] = field(default_factory=list)
    end_of_turn_id: int | None = None
    server_ignores_token_in: bool = False
    verified: dict[tuple[Any, ...], int | None] = field(default_factory=dict)
    """Appended-tail shapes (model, roles, tools) whose prefix preservation was checked with two
    renders, each with the number of end-of-turn tokens that precede the delta in the short tail
    render, or None where the short render does not give the same delta. A template property, so
    the collector shares one dict between all sessions."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_turn(self, turn: Turn) -> None:
        with self.lock:
            self.turns.append(turn)
            ended_on_eos = turn.finish_reason in ("stop", "tool_calls") and turn.stop_reason is None
            if ended_on_eos and turn.sampled_ids.shape[0] and self.end_of_turn_id is None:
                # with no stop string or stop token, a turn that stopped ended on the model's EOS
                self.end_of_turn_id = int(turn.sampled_ids[-1])


TAIL_HEAD: dict[str, str] = {"role": "user", "content": "."}
"""The fixed first message of the short tail render (many templates expect a user turn first)."""


def tools_key(payload: Mapping[str, Any]) -> bytes:
    """A comparable form of the request's tools (a changed tool list breaks append-only)."""
    return orjson.dumps(payload.get("tools"), option=orjson.OPT_SORT_KEYS)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return str(content)


def _tool_calls(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments)
        out.append((str(function.get("name")), arguments))
    return out


def same_assistant(sent: Any, answered: Mapping[str, Any] | None) -> bool:
    """Whether the assistant message the client sent back is the one the server answered with.

    Text is compared as text; tool calls by name and parsed arguments (frameworks re-serialize
    argument JSON, which changes bytes but not meaning). An edited answer is not append-only.
    """
    if not isinstance(sent, Mapping) or sent.get("role") != "assistant":
        return False
    if answered is None:
        return True  # nothing to compare with (the server returned no message)
    if _text(sent.get("content")).strip() != _text(answered.get("content")).strip():
        return False
    return _tool_calls(sent) == _tool_calls(answered)


def _find_parent(session: Session, messages: list[Any], key: bytes) -> tuple[Turn, bool] | None:
    """The turn this request extends (newest first), and whether it merely repeats it."""
    n = len(messages)
    with session.lock:
        turns = list(session.turns)
    for turn in reversed(turns):
        if turn.tools_key != key:
            continue
        k = len(turn.messages)
        if n == k and messages == turn.messages:
            return turn, True
        if (
            n > k + 1
            and messages[:k] == turn.messages
            and same_assistant(messages[k], turn.assistant)
        ):
            return turn, False
    return None


def plan(session: Session, payload: dict[str, Any]) -> Plan:
    """Decide the token prompt of a chat request in session mode (see the module docstring).

    Yields lists of `/tokenize` payloads; receives, for each, the token list or None on failure.
    """
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return SessionDecision(None, SessionNote.FALLBACK, "request has no messages")
    if not session.turns:
        return SessionDecision(None, SessionNote.FIRST)
    if session.server_ignores_token_in:
        return SessionDecision(
            None, SessionNote.FALLBACK, "the server ignores kv_transfer_params.prompt_token_ids"
        )
    if payload.get("echo") or payload.get("continue_final_message"):
        return SessionDecision(None, SessionNote.FALLBACK, "echo/continue_final_message request")
    key = tools_key(payload)
    found = _find_parent(session, messages, key)
    if found is None:
        return SessionDecision(
            None,
            SessionNote.FALLBACK,
            "history is not append-only (rewritten, trimmed or edited messages, or changed tools)",
        )
    parent, repeat = found
    if repeat:
        return SessionDecision(parent.prompt_ids, SessionNote.RESAMPLE)
    k = len(parent.messages)
    common: dict[str, Any] = {}
    if payload.get("tools"):
        common["tools"] = payload["tools"]
    if payload.get("chat_template_kwargs"):
        common["chat_template_kwargs"] = payload["chat_template_kwargs"]
    if payload.get("model"):
        common["model"] = payload["model"]
    generation_prompt = payload.get("add_generation_prompt", True) is not False
    after = {**common, "messages": messages, "add_generation_prompt": generation_prompt}
    tail = {
        **{key: value for key, value in common.items() if key != "tools"},
        "messages": [TAIL_HEAD, *messages[k:]],
        "add_generation_prompt": generation_prompt,
    }
    eot = session.end_of_turn_id
    if eot is None:
        return SessionDecision(None, SessionNote.FALLBACK, "end-of-turn token not known yet")
    roles = tuple(str(m.get("role")) for m in messages[k + 1 :] if isinstance(m, Mapping))
    shape = (
        str(payload.get("model")),
        roles,
        key,
        orjson.dumps(payload.get("chat_template_kwargs")),
    )
    sampled = parent.sampled_ids
    bridged = not (sampled.shape[0] and int(sampled[-1]) == eot)
    if shape in session.verified and (ends_before := session.verified[shape]) is not None:
        # this kind of tail was checked before and renders alike on its own: the short render,
        # cut after the end-of-turn tokens of its head and of the previous assistant turn
        (rendered_tail,) = yield [tail]
        if rendered_tail is None:
            return SessionDecision(None, SessionNote.FALLBACK, "the server's /tokenize failed")
        r = np.asarray(rendered_tail, dtype=np.int32)
        ends = np.flatnonzero(r == eot)
        if ends.shape[0] < ends_before:
            session.verified.pop(shape, None)
            return SessionDecision(
                None, SessionNote.FALLBACK, "the tail rendering has fewer turns than expected"
            )
        delta = r[int(ends[ends_before - 1]) + 1 :]
    elif shape in session.verified:
        # checked before, but the short render differs: one render of the whole conversation,
        # cut after as many end-of-turn tokens as the conversation so far holds
        (rendered_after,) = yield [after]
        if rendered_after is None:
            return SessionDecision(None, SessionNote.FALLBACK, "the server's /tokenize failed")
        b = np.asarray(rendered_after, dtype=np.int32)
        turns_so_far = int(np.count_nonzero(parent.prompt_ids == eot))
        turns_so_far += int(np.count_nonzero(sampled == eot)) + int(bridged)
        ends = np.flatnonzero(b == eot)
        if ends.shape[0] < turns_so_far or turns_so_far == 0:
            session.verified.pop(shape, None)
            return SessionDecision(
                None, SessionNote.FALLBACK, "the rendering has fewer turns than the conversation"
            )
        delta = b[int(ends[turns_so_far - 1]) + 1 :]
    else:
        before = {**common, "messages": messages[: k + 1], "add_generation_prompt": False}
        rendered_before, rendered_after, rendered_tail = yield [before, after, tail]
        if rendered_before is None or rendered_after is None:
            return SessionDecision(None, SessionNote.FALLBACK, "the server's /tokenize failed")
        a = np.asarray(rendered_before, dtype=np.int32)
        b = np.asarray(rendered_after, dtype=np.int32)
        ends = np.flatnonzero(a == eot)
        if ends.size == 0:
            return SessionDecision(
                None,
                SessionNote.FALLBACK,
                "the template renders no end-of-turn token after the turn",
            )
        cut = int(ends[-1]) + 1
        if b.shape[0] < cut or not np.array_equal(a[:cut], b[:cut]):
            return SessionDecision(
                None,
                SessionNote.FALLBACK,
                f"the template does not preserve the prefix when appending [{','.join(roles)}]",
            )
        delta = b[cut:]
        with session.lock:
            session.verified[shape] = _tail_ends_before(rendered_tail, delta, eot)
    pieces = [parent.prompt_ids, sampled]
    if bridged:
        pieces.append(np.array([eot], dtype=np.int32))
    pieces.append(delta)
    prompt = np.concatenate(pieces).astype(np.int32, copy=False)
    note = SessionNote.TOKEN_IN_BRIDGED if bridged else SessionNote.TOKEN_IN
    reason = f"previous turn ended with finish_reason={parent.finish_reason!r}" if bridged else None
    return SessionDecision(prompt, note, reason)


def _tail_ends_before(rendered_tail: list[int] | None, delta: IdArray, eot: int) -> int | None:
    """How many end-of-turn tokens precede `delta` in the short tail render, when that render ends
    with exactly `delta` right after an end-of-turn token; None when it cannot stand in."""
    if rendered_tail is None or delta.shape[0] == 0:
        return None
    r = np.asarray(rendered_tail, dtype=np.int32)
    head = r.shape[0] - delta.shape[0]
    if head < 1 or int(r[head - 1]) != eot or not np.array_equal(r[head:], delta):
        return None
    return int(np.count_nonzero(r[:head] == eot))


def with_token_prompt(payload: dict[str, Any], prompt_ids: IdArray) -> bytes:
    """The request body with the token prompt in `kv_transfer_params` (messages kept for parsing)."""
    kv = dict(payload.get("kv_transfer_params") or {})
    kv["prompt_token_ids"] = prompt_ids
    body = {**payload, "kv_transfer_params": kv}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
