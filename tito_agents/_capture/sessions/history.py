"""Append-only history: which earlier turn of a session a request extends, if any.

A request extends a turn when its messages are that turn's messages, the assistant message that
answered it (as the client sent it back) and new messages, with the same tools. Only then can the
previous prompt and sampled ids stand for the history.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import orjson

from tito_agents._capture.sessions.state import Session, Turn


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


def find_parent(session: Session, messages: list[Any], key: bytes) -> tuple[Turn, bool] | None:
    """The turn this request extends (newest first), and whether it merely repeats it."""
    count = len(messages)
    with session.lock:
        turns = list(session.turns)
    for turn in reversed(turns):
        if turn.tools_key != key:
            continue
        known = len(turn.messages)
        if count == known and messages == turn.messages:
            return turn, True
        if (
            count > known + 1
            and messages[:known] == turn.messages
            and same_assistant(messages[known], turn.assistant)
        ):
            return turn, False
    return None
