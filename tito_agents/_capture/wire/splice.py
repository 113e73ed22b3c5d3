"""Splicing fields into a caller's JSON request body without re-serialising what the caller wrote.

Capture adds a few fields to a request (`return_token_ids`, logprobs, the token prompt of a
session turn). Parsing the body and dumping it again would change the caller's own bytes: integers
beyond 64 bits become floats (another prompt, another answer), and float spellings, key order and
unicode escapes change. So the added fields are written into the caller's bytes: a new top-level
member before the closing brace, an existing member's value replaced in place, or an entry added
at the end of an existing list or object. Everything else stays byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["extend_container", "member_values", "set_members", "with_token_prompt"]

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
