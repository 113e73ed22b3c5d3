"""Helpers for the fake vLLM tests: calling the pure core, reading SSE, comparing JSON shapes.

The captures the fake is compared with are loaded by `tests.support.capture_replay`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tito_agents.testing import FakeVLLM

DONE = "[DONE]"

MESSAGES: Any = [
    {"role": "system", "content": "You are a helpful bot."},
    {"role": "user", "content": "what is the weather in paris"},
]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class Result:
    """A parsed response of the pure core: `body` for JSON, `events` for SSE."""

    status: int
    headers: dict[str, str]
    raw: bytes
    body: Any = None
    events: list[Any] | None = None

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """The JSON events of a stream, without the `[DONE]` marker."""
        return [e for e in self.events or [] if e != DONE]


def parse_sse(raw: bytes) -> list[Any]:
    """`data:` payloads of an SSE body, JSON-decoded (`[DONE]` stays a string)."""
    events = []
    for block in raw.decode("utf-8").split("\n\n"):
        if not block.strip():
            continue
        if block.startswith("event: "):  # the Responses API names each event; its data has `type`
            block = block.split("\n", 1)[1]
        assert block.startswith("data: "), block[:80]
        payload = block[len("data: ") :]
        events.append(payload if payload == DONE else json.loads(payload))
    return events


def call(
    fake: FakeVLLM,
    path: str,
    body: Any = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
) -> Result:
    """Send one request to the pure core and decode what comes back."""
    data = b"" if body is None else json.dumps(body).encode()
    response = fake.handle(method, path, data, headers or {})
    raw = asyncio.run(response.read()) if response.is_stream else response.body
    result = Result(response.status, dict(response.headers), raw)
    if response.is_stream:
        result.events = parse_sse(raw)
    elif raw:
        result.body = json.loads(raw)
    return result


def stream_token_ids(chunks: list[dict[str, Any]]) -> dict[int, list[int]]:
    """Concatenated delta `token_ids` per choice index."""
    ids: dict[int, list[int]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            ids.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    return ids


# -- structural comparison -----------------------------------------------------------------------

Skeleton = Any


def skeleton(value: Any, *, mapping: bool = False) -> Skeleton:
    """The shape of a JSON value: key order, null-vs-present and scalar types, not the values.

    Lists become the distinct shapes of their items. Dicts whose keys are data (legacy completions
    `top_logprobs`, `prompt_logprobs` entries) become `("map", value shapes)`.
    """
    if isinstance(value, dict):
        if mapping:
            return ("map", _distinct(skeleton(v) for v in value.values()))
        legacy = "text_offset" in value
        return (
            "dict",
            tuple((key, _field_skeleton(key, item, legacy=legacy)) for key, item in value.items()),
        )
    if isinstance(value, list):
        return ("list", _distinct(skeleton(item, mapping=mapping) for item in value))
    if value is None:
        return "null"
    return type(value).__name__


def _field_skeleton(key: str, value: Any, *, legacy: bool) -> Skeleton:
    keyed_by_data = key == "prompt_logprobs" or (legacy and key == "top_logprobs")
    if keyed_by_data and isinstance(value, list):
        return ("list", _distinct(skeleton(item, mapping=True) for item in value))
    return skeleton(value)


def _distinct(items: Any) -> tuple[Skeleton, ...]:
    seen: list[Skeleton] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return tuple(seen)


def compatible(ours: Skeleton, theirs: Skeleton, where: str = "$") -> list[str]:
    """Differences between two shapes; an empty list is compatible with any list."""
    if isinstance(ours, tuple) and isinstance(theirs, tuple) and ours[0] == theirs[0]:
        if ours[0] == "dict":
            our_keys = [k for k, _ in ours[1]]
            their_keys = [k for k, _ in theirs[1]]
            if our_keys != their_keys:
                return [f"{where}: keys {our_keys} != {their_keys}"]
            problems: list[str] = []
            for (key, a), (_, b) in zip(ours[1], theirs[1], strict=True):
                problems += compatible(a, b, f"{where}.{key}")
            return problems
        if not ours[1] or not theirs[1]:
            return []
        problems = []
        for item in ours[1]:
            if all(compatible(item, other, where) for other in theirs[1]):
                problems.append(f"{where}[]: {item!r} matches no item shape of the capture")
        for item in theirs[1]:
            if all(compatible(other, item, where) for other in ours[1]):
                problems.append(f"{where}[]: the capture's {item!r} matches none of ours")
        return problems
    if ours != theirs:
        return [f"{where}: {ours!r} != {theirs!r}"]
    return []
