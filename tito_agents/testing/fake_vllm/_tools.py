"""vLLM's `hermes` tool parser, as the fake needs it: whole-text extraction and streaming deltas.

Non-streaming: every `<tool_call>...</tool_call>` block (or a trailing unterminated one) must be JSON
with `name` and `arguments`; `arguments` are re-serialised to a JSON string, `content` is the text
before the first block (None when empty). Any parse failure means "no tool call": the raw text stays
in `content`, as when generation stopped inside the call.

Streaming: the text so far is re-parsed on every step and compared with what was already sent:
content is released up to a possible partial `<tool_call>` tag; a call's name is announced (with a
fresh `chatcmpl-tool-<16 hex>` id) once its closing quote has arrived; argument text is sent as it
grows, measured after stripping trailing whitespace and cut at the closing brace of the arguments
object. Steps that release nothing return None, which the chat stream turns into an empty `{}`
delta (or skips, see the stream serializer).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HermesStream", "ParsedTools", "ToolDelta", "new_tool_call_id", "parse_tool_calls"]

START = "<tool_call>"
END = "</tool_call>"
_BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGUMENTS = re.compile(r'"arguments"\s*:\s*')


def new_tool_call_id() -> str:
    """A vLLM 0.32 tool-call id: `chatcmpl-tool-` and 16 random hex characters."""
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class ParsedTools:
    """The result of parsing a finished output: the calls as `(name, arguments_json)` and content."""

    calls: tuple[tuple[str, str], ...]
    content: str | None


def parse_tool_calls(text: str) -> ParsedTools:
    """vLLM's `Hermes2ProToolParser.extract_tool_calls`."""
    if START not in text:
        return ParsedTools((), text)
    try:
        calls = []
        for closed, unclosed in _BLOCKS.findall(text):
            payload = json.loads(closed or unclosed)
            arguments = json.dumps(payload["arguments"], ensure_ascii=False)
            calls.append((str(payload["name"]), arguments))
    except (ValueError, KeyError, TypeError):
        return ParsedTools((), text)
    content = text[: text.find(START)]
    return ParsedTools(tuple(calls), content or None)


@dataclass(frozen=True)
class ToolDelta:
    """One entry of `delta.tool_calls`: a name announcement (with id) or an arguments fragment."""

    index: int
    name: str | None = None
    arguments: str | None = None
    call_id: str | None = None


@dataclass
class HermesStream:
    """Incremental parser state for one streamed choice."""

    _sent_content: int = 0
    _names: list[str | None] = field(default_factory=list)
    _sent_args: list[str] = field(default_factory=list)

    def feed(
        self, text: str, *, finished: bool = False
    ) -> tuple[str | None, list[ToolDelta]] | None:
        """Given the whole text so far, what to send now: (content or None, tool deltas) or None."""
        content = self._content(text, finished)
        deltas: list[ToolDelta] = []
        for index, (body, complete) in enumerate(_regions(text)):
            if index == len(self._names):
                self._names.append(None)
                self._sent_args.append("")
            if self._names[index] is None:
                match = _NAME.search(body)
                if match is None:
                    break
                self._names[index] = match.group(1)
                deltas.append(ToolDelta(index, name=match.group(1), call_id=new_tool_call_id()))
            arguments = _arguments_text(body, complete)
            if arguments is not None and len(arguments) > len(self._sent_args[index]):
                deltas.append(ToolDelta(index, arguments=arguments[len(self._sent_args[index]) :]))
                self._sent_args[index] = arguments
        if content or deltas:
            return content, deltas
        return None

    @property
    def called(self) -> bool:
        return any(name is not None for name in self._names)

    def _content(self, text: str, finished: bool) -> str | None:
        if START in text:
            end = text.index(START)
        else:
            end = len(text) if finished else len(text) - _partial_overlap(text, START)
        if end > self._sent_content:
            content = text[self._sent_content : end]
            self._sent_content = end
            return content
        return None


def _partial_overlap(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def _regions(text: str) -> list[tuple[str, bool]]:
    """`(json text, complete)` for each `<tool_call>` region of the text so far."""
    regions: list[tuple[str, bool]] = []
    position = 0
    while (start := text.find(START, position)) != -1:
        body_start = start + len(START)
        end = text.find(END, body_start)
        if end != -1:
            regions.append((text[body_start:end].strip(), True))
            position = end + len(END)
            continue
        raw = text[body_start:]
        overlap = _partial_overlap(raw, END)
        body = (raw[:-overlap] if overlap else raw).strip()
        regions.append((body, bool(body) and _is_json(body)))
        break
    return regions


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _arguments_text(body: str, complete: bool) -> str | None:
    """The arguments value so far: brace-matched when it is an object or array."""
    match = _ARGUMENTS.search(body)
    if match is None:
        return None
    raw = body[match.end() :]
    if not raw or raw[0] not in "{[":
        if complete:
            raw = raw.rstrip()
            raw = raw[:-1].rstrip() if raw.endswith("}") else raw
        return raw
    opening, closing = raw[0], "}" if raw[0] == "{" else "]"
    depth, in_string, escaped = 0, False, False
    for position, char in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth == 0:
                return raw[: position + 1]
    return raw


def tool_call_json(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A non-streaming `message.tool_calls` entry, in vLLM's key order."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
