"""Token-in sessions: the server never re-tokenizes what the model sampled.

In session mode the capture layer keeps, per (episode, agent), the turns it has seen: the request
messages, the token prompt the server used, the ids it sampled and the assistant message it
returned. A later chat request that only appends to one of those turns (its messages = that turn's
messages + the assistant message that answered it + new messages) is turned into a token-in request:

    prompt = previous prompt ids + previous sampled ids [+ end-of-turn bridge] + delta

where `delta` are the tokens of the new messages, computed from the server's own chat template with
`/tokenize` (no local tokenizer): the conversation ending with the previous assistant turn (cut after
its end-of-turn token) and the same with the new messages and the generation prompt; the first must
be a prefix of the second, and hold as many end-of-turn tokens as the conversation so far (so the
cut is the end of the previous assistant turn, never an earlier one). That check runs the first
time each kind of tail (server, model, its roles, the tools) is appended, together with a third,
short render: a fixed one-message head, the previous assistant message and the new messages,
without tools. When that short render ends with exactly the same delta, later tails of the same
kind need only the short render (its cost does not grow with the conversation, and tool schemas,
which are slow to render, are left out); otherwise they need one render of the whole conversation,
cut after as many end-of-turn tokens as it already holds. A cut that does not fit forgets the kind
again, so the next tail of that kind is checked afresh. The prompt goes to vLLM 0.32 as
`kv_transfer_params.prompt_token_ids`, which replaces the rendered prompt while `messages` still
drive tool parsing, so the response stays an ordinary chat completion.

The end-of-turn token is known before the first append: unless given
(`Collector(end_of_turn_id=...)`), it is derived from the server's own template with the first
check's renders (`end_of_turn_renders`: a tiny conversation whose assistant text is "1", "2" and
"1."; the token right after the text, the same in all three, ends the turn) and kept per server and
model. A template that writes nothing after an assistant turn (GLM), or whose end-of-turn marker is
not one token of the served tokenizer, has no usable token: its sessions fall back, saying so.

Where the template does not preserve the prefix (stock templates that drop past reasoning or an
empty reasoning block: Qwen3, DeepSeek-R1, GLM), the call falls back with where the template
re-renders history and what fixes it, unless the collector opted into `SessionHistoryPolicy.SAMPLED`:
then the model keeps its own sampled tokens in context and only the new messages are rendered (the
whole render cut after the conversation's turn ends), noted `token_in_sampled`. The model then
sees history the way it sampled it, not the way its template would re-render it.

Anything else falls back to normal rendering for that call, with the reason recorded on the call
(`Call.session`): history that is not append-only, a server without `/tokenize` or one that
ignored the token prompt. Sampled ids are never re-encoded.

Responses API requests are planned here too, as the chat conversation the server renders them as
(`tito_agents._wire.responses_chat`: the request's `chat_view`, the response's output items as the
assistant message): one planner for both APIs.

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
from tito_agents.config import SessionHistoryPolicy

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


@dataclass(frozen=True, slots=True)
class EndOfTurn:
    """What the server's template ends an assistant turn with: `token`, or None and `missing`
    (why there is no usable token; every append of such a session falls back with it)."""

    token: int | None
    missing: str | None = None


@dataclass(frozen=True, slots=True)
class TailCheck:
    """What the first check of one kind of tail found (a template property, shared by sessions).

    `ends_before`: how many end-of-turn tokens precede the delta in the short tail render, or None
    where the short render does not give the same delta (the whole conversation is rendered then).
    `preserves_prefix`: False where the template re-renders earlier turns once these messages are
    appended; `reason` then says how and what fixes it (token-in only with `SessionHistoryPolicy.SAMPLED`).
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
    end_of_turn_missing: str | None = None
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


TAIL_HEAD: dict[str, str] = {"role": "user", "content": "."}
"""The fixed first message of the short tail render (many templates expect a user turn first)."""

END_OF_TURN_PROBES = ("1", "2", "1.")
"""Assistant texts of the derivation renders: two that differ in one token (the common suffix
after them is what the template writes after a turn), and one that ends on punctuation, which
merges with a marker that is text rather than one token of the served tokenizer."""


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
        return EndOfTurn(
            None,
            "the template writes no end-of-turn token after an assistant turn (the next turn's "
            "header follows its text directly, as in GLM templates), so a turn's end cannot be "
            "cut; give Collector(end_of_turn_id=...) only if the model ends its turns with a "
            "token the template also renders there",
        )
    if _common_suffix(one, dotted) < after:
        return EndOfTurn(
            None,
            "the template's end-of-turn marker is not one token of the served tokenizer (it "
            "merges with the text before it: the tokenizer lacks the template's special tokens), "
            "so a turn's end cannot be cut exactly; serve the tokenizer the template was written "
            "for (`tito-agents audit-template --tokenizer` reports this as a token boundary)",
        )
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


def plan(
    session: Session,
    payload: dict[str, Any],
    server: str = "",
    history: SessionHistoryPolicy = SessionHistoryPolicy.TEMPLATE,
) -> Plan:
    """Decide the token prompt of a chat request in session mode (see the module docstring).

    `server` names the server the request goes to (tail kinds are checked per server); `history`
    says whether a template that re-renders history differently falls back (`TEMPLATE`) or keeps
    the sampled tokens (`SAMPLED`). Yields lists of `/tokenize` payloads; receives, for each, the
    token list or None on failure.
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
    if session.end_of_turn_missing is not None:
        return SessionDecision(None, SessionNote.FALLBACK, session.end_of_turn_missing)
    k = len(parent.messages)
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
    after = {**common, "messages": messages, "add_generation_prompt": generation_prompt}
    tail = {
        **untooled,
        "messages": [TAIL_HEAD, *messages[k:]],
        "add_generation_prompt": generation_prompt,
    }
    roles = tuple(str(m.get("role")) for m in messages[k + 1 :] if isinstance(m, Mapping))
    shape = (
        server,
        str(payload.get("model")),
        roles,
        key,
        orjson.dumps(payload.get("chat_template_kwargs")),
        str(payload.get("chat_template")),
    )
    checked = session.verified.get(shape)
    if (
        checked is not None
        and not checked.preserves_prefix
        and history is SessionHistoryPolicy.TEMPLATE
    ):
        return SessionDecision(None, SessionNote.FALLBACK, checked.reason)
    derive = [] if session.end_of_turn_checked else end_of_turn_renders(untooled, messages)
    if checked is None:
        before = {**common, "messages": messages[: k + 1], "add_generation_prompt": False}
        asks = [before, after, tail]
    else:
        asks = [tail] if checked.ends_before is not None else [after]
    results = yield [*derive, *asks]
    if derive:
        derived = derive_end_of_turn(results[: len(derive)])
        results = results[len(derive) :]
        if derived is not None:
            session.known_end_of_turn(derived)
        else:  # inconclusive: the EOS of a turn that stopped stands in, as before derivation
            session.end_of_turn_checked = True
            session.end_of_turn_id = session.learnt_eos
        if session.end_of_turn_missing is not None:
            return SessionDecision(None, SessionNote.FALLBACK, session.end_of_turn_missing)
    eot = session.end_of_turn_id if session.end_of_turn_id is not None else session.learnt_eos
    if eot is None:
        return SessionDecision(
            None,
            SessionNote.FALLBACK,
            "end-of-turn token not known yet (the template refused the short conversation it is "
            "derived from and no turn has ended on EOS); give Collector(end_of_turn_id=...)",
        )
    sampled = parent.sampled_ids
    bridged = not (sampled.shape[0] and int(sampled[-1]) == eot)
    turns_so_far = int(np.count_nonzero(parent.prompt_ids == eot))
    turns_so_far += int(np.count_nonzero(sampled == eot)) + int(bridged)
    if checked is not None:
        (rendered,) = results
        if rendered is None:
            return SessionDecision(None, SessionNote.FALLBACK, "the server's /tokenize failed")
        r = np.asarray(rendered, dtype=np.int32)
        # the short render is cut after the end-of-turn tokens of its head and of the previous
        # assistant turn; the whole render after as many as the conversation so far holds
        ends_before = checked.ends_before if checked.ends_before is not None else turns_so_far
        ends = np.flatnonzero(r == eot)
        if ends.shape[0] < ends_before or ends_before == 0:
            session.verified.pop(shape, None)
            return SessionDecision(
                None, SessionNote.FALLBACK, "the rendering has fewer turns than the conversation"
            )
        delta = r[int(ends[ends_before - 1]) + 1 :]
    else:
        rendered_before, rendered_after, rendered_tail = results
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
        if ends.size != turns_so_far:
            return SessionDecision(
                None,
                SessionNote.FALLBACK,
                f"the template renders {ends.size} end-of-turn tokens up to the previous "
                f"assistant turn where the conversation so far holds {turns_so_far} (a message "
                "contains the token, or the template drops or merges turns)",
            )
        cut = int(ends[-1]) + 1
        if b.shape[0] >= cut and np.array_equal(a[:cut], b[:cut]):
            delta, reason = b[cut:], None
        else:
            reason = _not_preserved(a, b, ends, roles)
            if history is SessionHistoryPolicy.TEMPLATE:
                with session.lock:
                    session.verified[shape] = TailCheck(None, False, reason)
                return SessionDecision(None, SessionNote.FALLBACK, reason)
            ends_after = np.flatnonzero(b == eot)
            if ends_after.shape[0] < turns_so_far:
                return SessionDecision(
                    None,
                    SessionNote.FALLBACK,
                    "the rendering has fewer turns than the conversation",
                )
            delta = b[int(ends_after[turns_so_far - 1]) + 1 :]
        with session.lock:
            session.verified[shape] = TailCheck(
                _tail_ends_before(rendered_tail, delta, eot), reason is None, reason
            )
    pieces = [parent.prompt_ids, sampled]
    if bridged:
        pieces.append(np.array([eot], dtype=np.int32))
    pieces.append(delta)
    prompt = np.concatenate(pieces).astype(np.int32, copy=False)
    notes = []
    if bridged:
        notes.append(
            f"previous turn ended with finish_reason={parent.finish_reason!r}, without the "
            "end-of-turn token: the token was added as context"
        )
    preserved = checked.preserves_prefix if checked is not None else reason is None
    if not preserved:
        notes.append(
            "the template would re-render the history differently; the model's sampled tokens "
            "were kept (session_history='sampled')"
        )
        return SessionDecision(prompt, SessionNote.TOKEN_IN_SAMPLED, "; ".join(notes))
    if bridged:
        return SessionDecision(prompt, SessionNote.TOKEN_IN_BRIDGED, notes[0])
    return SessionDecision(prompt, SessionNote.TOKEN_IN)


_FIX = (
    "Fix: serve a prefix-preserving template (`vllm serve --chat-template`; trl ships training "
    "templates for these families, e.g. trl/chat_templates/qwen3_training.jinja; `tito-agents "
    "audit-template` names the cause), or keep the model's sampled tokens in context with "
    "Collector(session_history='sampled')"
)


def _not_preserved(
    a: IdArray, b: IdArray, ends: np.ndarray[Any, Any], roles: tuple[str, ...]
) -> str:
    """Why the first check failed, precisely: where the template re-renders the history."""
    n = min(a.shape[0], b.shape[0])
    first = int(np.argmax(a[:n] != b[:n])) if not np.array_equal(a[:n], b[:n]) else n
    turn_start = int(ends[-2]) + 1 if ends.shape[0] > 1 else 0
    appended = ",".join(roles)
    head = f"the template does not preserve the prefix when appending [{appended}]: "
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
    return head + where + _FIX


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
