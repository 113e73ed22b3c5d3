"""Splicing on raw JSON bytes: fields into a caller's request, nulls into a server's answer.

Capture adds a few fields to a request (`return_token_ids`, logprobs, the token prompt of a
session turn), and sets the answers to them back to null in the body the caller gets. Parsing a
body and dumping it again would change bytes no one asked to change: integers beyond 64 bits
become floats (another prompt, another answer; another tool schema echoed back), and float
spellings, key order, whitespace and unicode escapes change. So the edits are made on the bytes:
a new top-level member before the closing brace, an existing member's value replaced in place,
an entry added at the end of an existing list or object (requests), a value at a path replaced
by `null` (answers, `null_values`). Everything else stays byte for byte.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

__all__ = ["extend_container", "member_values", "null_values", "set_members", "with_token_prompt"]

_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\],:]', re.S)
"""Strings (skipped whole, escapes included) and the structural characters of JSON."""


def member_values(body: bytes) -> dict[str, tuple[int, int]]:
    """The byte span of each top-level member's value in a JSON object body (for a duplicated
    key, its last value: the one JSON parsers keep). The body must be a valid JSON object."""
    spans: dict[str, tuple[int, int]] = {}
    depth = 0
    key: str | None = None
    start = 0
    expect_key = False
    for match in _TOKEN.finditer(body):
        token = match.group()
        first = token[:1]
        if first == b'"':
            if depth == 1 and expect_key:
                key, expect_key = orjson.loads(token), False
        elif first in b"{[":
            depth += 1
            if depth == 1:
                expect_key = True
        elif first == b":":
            if depth == 1:
                start = match.end()
        elif first == b",":
            if depth == 1:
                spans[key or ""] = _trimmed(body, start, match.start())
                expect_key = True
        else:  # a closing bracket
            if depth == 1 and key is not None and first == b"}":
                spans[key] = _trimmed(body, start, match.start())
            depth -= 1
            if depth == 0:
                break
    return spans


def _trimmed(body: bytes, start: int, end: int) -> tuple[int, int]:
    while start < end and body[start] in b" \t\r\n":
        start += 1
    while end > start and body[end - 1] in b" \t\r\n":
        end -= 1
    return start, end


def set_members(body: bytes, members: Mapping[str, bytes], parsed: Mapping[str, Any]) -> bytes:
    """`body` (a JSON object, `parsed` as its value) with each of `members` (raw JSON values)
    set: a member the body has gets its value replaced where it stands, one it lacks is added
    before the closing brace."""
    present = [key for key in members if key in parsed]
    spans = member_values(body) if present else {}  # a rare path: a member is already there
    added = b""
    for key, value in members.items():
        if key not in spans:
            added += b',"' + key.encode() + b'":' + value
    if not parsed:
        added = added[1:]
    close = body.rfind(b"}")  # the object's own: only whitespace may follow it
    out = body[:close] + added + body[close:]
    if spans:
        edits = sorted(((*spans[key], members[key]) for key in present), reverse=True)
        for start, end, value in edits:  # all before `close`: from the last, offsets hold
            out = out[:start] + value + out[end:]
    return out


def extend_container(value: bytes, entry: bytes, *, empty: bool) -> bytes:
    """A raw JSON list (or object) `value` with `entry` (a raw element, or `"key":value` member)
    added at its end; `empty`: it holds nothing yet."""
    close = len(value.rstrip()) - 1
    return value[:close] + (b"" if empty else b",") + entry + value[close:]


def with_token_prompt(body: bytes, payload: Mapping[str, Any], prompt_ids: Any) -> bytes:
    """The request `body` (`payload` parsed) with a token-in session's prompt added as
    `kv_transfer_params.prompt_token_ids` (the caller's other `kv_transfer_params` entries and
    every other byte kept; the messages stay for response parsing). The caller's
    `kv_transfer_params` must be absent, null or an object without a token prompt."""
    kv = payload.get("kv_transfer_params")
    entry = b'"prompt_token_ids":' + orjson.dumps(prompt_ids, option=orjson.OPT_SERIALIZE_NUMPY)
    if kv is None:
        value = b"{" + entry + b"}"
    elif isinstance(kv, dict) and "prompt_token_ids" not in kv:
        start, end = member_values(body)["kv_transfer_params"]
        value = extend_container(body[start:end], entry, empty=not kv)
    else:
        raise ValueError("kv_transfer_params is not an object without a token prompt")
    return set_members(body, {"kv_transfer_params": value}, payload)


# ---- answers: values set back to null ----

Path = tuple[str | int, ...]
"""Where a value sits in a JSON document: object keys and list indices, from the top."""

_LEAF: Any = object()
_SPACE = re.compile(rb"[ \t\r\n]*")
# strings as `"[^"\\]*(?:\\.[^"\\]*)*"`: runs of plain characters in one step (an alternation
# per character is several times slower on a long text)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]]', re.S)
_SCALAR_END = re.compile(rb"[,}\] \t\r\n]|$")
_SCALAR = rb'(?:"[^"\\]*+(?:\\.[^"\\]*+)*+"|[^ \t\r\n,\]}"\[{]++)'
_AFTER = re.compile(rb"[ \t\r\n]*+(?:,[ \t\r\n]*+)?")
"""What follows a value up to the next member or element (or the closing bracket)."""
_KEY = re.compile(rb'"([^"\\]*+(?:\\.[^"\\]*+)*+)"[ \t\r\n]*+:[ \t\r\n]*+', re.S)
"""A member's key (its raw text in group 1) and colon, up to its value."""
_SCALAR_AND_AFTER = re.compile(_SCALAR + _AFTER.pattern, re.S)
"""A string, number, true, false or null element and what follows it, in one match."""


def null_values(body: bytes, paths: Iterable[Path]) -> bytes:
    """`body` (valid JSON) with the value at each of `paths` replaced by `null`, every other byte
    kept; a path the body does not hold is skipped. A duplicated key has each of its values
    nulled. Only the containers on a path are walked member by member (a member off the path in
    one regular-expression match); any other container is jumped over at the speed of a search
    for its strings and brackets (a long id array is one match)."""
    tree: dict[Any, Any] = {}
    for path in paths:
        node = tree
        steps = [step.encode() if isinstance(step, str) else step for step in path]
        for step in steps[:-1]:
            child = node.setdefault(step, {})
            if child is _LEAF:
                break
            node = child
        else:
            node[steps[-1]] = _LEAF
    start = _SPACE.match(body).end()  # type: ignore[union-attr]
    if not tree or body[start] not in b"{[":
        return body
    spans: list[tuple[int, int]] = []
    _walk(body, start, tree, spans)
    out: list[bytes] = []
    pos = 0
    for start, end in sorted(spans):
        out += (body[pos:start], b"null")
        pos = end
    out.append(body[pos:])
    return b"".join(out)


def _walk(body: bytes, pos: int, node: dict[Any, Any], spans: list[tuple[int, int]]) -> int:
    """The end of the container at `pos`; the spans of the values `node` names in it are noted
    (`node`: keys as raw UTF-8 bytes, list indices as ints)."""
    if body[pos] == 0x7B:  # "{"
        return _walk_object(body, pos, node, spans)
    return _walk_list(body, pos, node, spans)


def _walk_object(body: bytes, pos: int, node: dict[Any, Any], spans: list[tuple[int, int]]) -> int:
    """`_walk` of an object: one match passes every member up to the next one `node` names."""
    passing = _passer(tuple(sorted(key for key in node if type(key) is bytes)))
    pos += 1
    while True:
        pos = passing.match(body, pos).end()  # type: ignore[union-attr]
        first = body[pos]
        if first == 0x7D:  # "}"
            return pos + 1
        if first != 0x22:  # a container deeper than `_CONTAINER` reaches
            pos = _skip(body, pos)
            continue
        key = _KEY.match(body, pos)
        assert key is not None
        step = key.group(1)
        if b"\\" in step:  # an escaped key: compared as the text it stands for
            step = orjson.loads(b'"' + step + b'"').encode()
        pos = _visit(body, key.end(), node.get(step), spans)


def _walk_list(body: bytes, pos: int, node: dict[Any, Any], spans: list[tuple[int, int]]) -> int:
    """`_walk` of a list: an element off the path that is no container is passed in one match."""
    pos = _SPACE.match(body, pos + 1).end()  # type: ignore[union-attr]
    index = 0
    while body[pos] != 0x5D:  # "]"
        child = node.get(index)
        index += 1
        if child is None:
            scalar = _SCALAR_AND_AFTER.match(body, pos)
            if scalar is not None:
                pos = scalar.end()
                continue
        pos = _AFTER.match(body, _visit(body, pos, child, spans)).end()  # type: ignore[union-attr]
    return pos + 1


def _visit(body: bytes, start: int, child: Any, spans: list[tuple[int, int]]) -> int:
    """The end of the value at `start`, which `child` (of the path tree) says what to do with."""
    if child is None or child is _LEAF or body[start] not in b"{[":
        end = _skip(body, start)
        if child is _LEAF:
            spans.append((start, end))
        return end
    return _walk(body, start, child, spans)


@functools.lru_cache(maxsize=64)
def _passer(keys: tuple[bytes, ...]) -> re.Pattern[bytes]:
    """Everything of an object up to the next member whose key is one of `keys` (or is written
    with an escape: compared once decoded), or up to its closing brace. A string is a key where
    a colon follows it; a container is passed whole (up to `_CONTAINER`'s depth)."""
    stops = [rb'"[^"\\]*+\\.(?:[^"\\]++|\\.)*+"']
    if keys:
        stops.append(rb'"(?:' + b"|".join(re.escape(key) for key in keys) + rb')"')
    stop = rb"(?:" + b"|".join(stops) + rb")[ \t\r\n]*+:"
    return re.compile(
        rb'(?:[^"\[\]{}]++|(?!'
        + stop
        + rb")"
        + _STRING.pattern
        + rb"|"
        + _CONTAINER.pattern
        + rb")*+",
        re.S,
    )


def _nested(depth: int) -> re.Pattern[bytes]:
    """A JSON list or object holding containers at most `depth` levels deep, matched whole (the
    body is valid JSON, so a bracket's kind need not be checked). Possessive: a deeper one fails
    at once instead of backtracking."""
    atom = rb'[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+"'
    level = rb"[\[{](?:" + atom + rb")*+[\]}]"
    for _ in range(depth):
        level = rb"[\[{](?:" + atom + rb"|" + level + rb")*+[\]}]"
    return re.compile(level, re.S)


_CONTAINER = _nested(8)
"""A container passed in one match (an answer's logprob entries are 5 to 7 levels deep)."""


def _skip(body: bytes, pos: int) -> int:
    """The end of the JSON value that starts at `pos`."""
    first = body[pos]
    if first == 0x22:  # '"'
        return _STRING.match(body, pos).end()  # type: ignore[union-attr]
    if first not in b"{[":
        return _SCALAR_END.search(body, pos).start()  # type: ignore[union-attr]
    whole = _CONTAINER.match(body, pos)
    if whole is not None:
        return whole.end()
    depth = 0  # deeper than `_CONTAINER` reaches: bracket by bracket
    for match in _STRING_OR_BRACKET.finditer(body, pos):
        token = match.group()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return match.end()
    raise ValueError("unterminated JSON container")
