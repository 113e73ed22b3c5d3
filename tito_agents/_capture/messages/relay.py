"""Anthropic Messages calls in the capture transports, without I/O: the probes of the server's
conversion choices, and the relay that turns the chat stream the engine answers into the Messages
events vLLM's `/v1/messages` sends.

A Messages request is sent as vLLM's own chat conversion (`messages.convert`), so the chat
tee records the call with exact ids. Two choices of that conversion are the server's own
(`messages.probe`): `probe_plan` asks the server once per (server, model), only when a request
depends on one, by the requests it yields (`Ask`: a path and a JSON body; the flow sends them and
sends back each `(status, body)`, None where it failed). The relay reads the chat stream's bytes as
they pass to the caller and hands the caller the Messages events they make, as they arrive.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

import orjson

from tito_agents._capture.messages.probe import (
    disabled_effort_from,
    effort_probes,
    merge_from_counts,
    merge_probe,
)
from tito_agents._capture.messages.reply import MessagesStream, encode_event
from tito_agents._capture.wire import ParsedChoice
from tito_agents._capture.wire.sse import SSEDecoder

__all__ = [
    "COUNT_TOKENS",
    "TOKENIZE",
    "Ask",
    "MessagesRelay",
    "ProbePlan",
    "messages_outputs",
    "probe_plan",
]

COUNT_TOKENS = "count_tokens"
"""An ask for the server's `/v1/messages/count_tokens` (next to the request's `/messages`)."""
TOKENIZE = "tokenize"
"""An ask for the server's `/tokenize` (at its root)."""
Ask = tuple[str, dict[str, Any]]
"""A probe request: which endpoint (`COUNT_TOKENS`, `TOKENIZE`) and its JSON body."""
Answer = tuple[int, bytes] | None
ProbePlan = Generator[list[Ask], Sequence[Answer], dict[str, Any]]
"""Yields the asks of one round, is sent their answers, returns the probed choices (None: unknown)."""


def probe_plan(model: str, needed: list[str]) -> ProbePlan:
    """Find out the choices `needed` (`messages_probe.PROBES` names) of the server for `model`,
    as vLLM works them out (`messages.probe`); a choice the answers do not decide is None."""
    options: dict[str, Any] = {}
    if "merge_inline_system" in needed:
        count, merged, unmerged = merge_probe(model)
        answers = yield [(COUNT_TOKENS, count), (TOKENIZE, merged), (TOKENIZE, unmerged)]
        counted = _json_field(answers[0], "input_tokens")
        counts = [_json_field(answer, "tokens") for answer in answers[1:]]
        lengths = [len(r) if isinstance(r, list) else None for r in counts]
        options["merge_inline_system"] = (
            merge_from_counts(counted, lengths[0], lengths[1]) if type(counted) is int else None
        )
    if "disabled_thinking_effort" in needed:
        probes = effort_probes(model)
        answers = yield [(TOKENIZE, body) for body in probes.values()]
        tokens = [_json_field(answer, "tokens") for answer in answers]
        renders = {
            e: t if isinstance(t, list) else None for e, t in zip(probes, tokens, strict=True)
        }
        # vLLM's own probe says "low" when `none` fails to render; here an answer that never came
        # (every render failed: no /tokenize) decides nothing
        known = any(render is not None for render in renders.values())
        options["disabled_thinking_effort"] = disabled_effort_from(renders) if known else None
    return options


def _json_field(answer: Answer, key: str) -> Any:
    if answer is None or answer[0] != 200:
        return None
    try:
        data = orjson.loads(answer[1])
    except orjson.JSONDecodeError:
        return None
    return data.get(key) if isinstance(data, dict) else None


def messages_outputs(choice: ParsedChoice) -> None:
    """Note on a Messages call's choice what its answer's tool_use and thinking blocks were made
    of (`Call.tool_calls`, `Call.reasoning`), from the chat message it was converted from (kept:
    `RequestInfo.want_message`): each tool call as `call_id`, `name`, `arguments` (the JSON text
    the model wrote), `id`; the reasoning text."""
    message = choice.message
    if not isinstance(message, dict):
        return
    calls = [
        {
            "call_id": call.get("id"),
            "name": (call.get("function") or {}).get("name"),
            "arguments": (call.get("function") or {}).get("arguments"),
            "id": call.get("id"),
        }
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    ]
    choice.tool_calls = calls or None
    reasoning = message.get("reasoning")
    choice.reasoning = [reasoning] if isinstance(reasoning, str) and reasoning else None


class Decoder(Protocol):
    """Incremental decoding of a compressed body (the HTTP library's own decoders)."""

    def decode(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class MessagesRelay:
    """The chat stream's raw bytes in, as they arrive; the Messages events they complete out
    (`MessagesStream`, encoded as vLLM writes them). `end` at the end of the chat stream."""

    __slots__ = ("_decoder", "_decompressor", "_stream")

    def __init__(self, decompressor: Decoder | None = None) -> None:
        self._decoder = SSEDecoder()
        self._stream = MessagesStream()
        self._decompressor = decompressor

    def feed(self, data: bytes) -> bytes:
        if self._decompressor is not None:
            data = self._decompressor.decode(data)
        return self._events(self._decoder.feed(data))

    def end(self) -> bytes:
        tail = self._decompressor.flush() if self._decompressor is not None else b""
        return self._events(self._decoder.feed(tail) + self._decoder.flush())

    def _events(self, payloads: list[bytes]) -> bytes:
        out = []
        for payload in payloads:
            if payload == b"[DONE]":
                events = self._stream.done()
            else:
                try:
                    chunk = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    chunk = None  # not a chat chunk: the stream ends with an error event
                events = self._stream.chunk(chunk)
            out += [encode_event(name, data) for name, data in events]
        return b"".join(out)
