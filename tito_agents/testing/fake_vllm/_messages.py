"""The fake's Anthropic Messages routes: `/v1/messages` and `/v1/messages/count_tokens`.

vLLM 0.32 converts a Messages request to a chat completion, runs it and converts the answer back
(`vllm/entrypoints/anthropic/serving.py`). The fake does the same with the library's own
conversion (`tito_agents._capture.messages.convert` / `messages_reply`) around its chat endpoint, so a
test against the fake checks capture's plumbing (the request sent as chat, the stream relayed,
errors passed through), not the conversion itself: the fake and capture share it. The conversion
is checked against vLLM's own converters (tests/unit/test_messages_wire.py) and side by side
with the real server's `/v1/messages` (tests/e2e/test_messages_real.py), the independent checks.

The fake's chat template takes a system message anywhere, so inline system messages are not
merged (as vLLM decides for such a template).
"""

from __future__ import annotations

from typing import Any

from tito_agents._capture.messages.convert import chat_request
from tito_agents._capture.messages.reply import (
    MessagesStream,
    ReplyError,
    error_body,
    messages_response,
)
from tito_agents.testing.fake_vllm._chat import chat
from tito_agents.testing.fake_vllm._engine import Engine, Reply, WireFaults


def _chat_body(body: dict[str, Any]) -> dict[str, Any] | Reply:
    converted = chat_request(body)
    if isinstance(converted, str):
        return Reply(status=400, body=error_body("invalid_request_error", converted))
    return {k: v for k, v in converted.items() if v is not None}


def messages(engine: Engine, body: dict[str, Any], faults: WireFaults) -> Reply:
    """`POST /v1/messages`: the chat completion of the converted request, converted back."""
    converted = _chat_body(body)
    if isinstance(converted, Reply):
        return converted
    reply = chat(engine, converted, faults)
    if reply.status != 200:
        return reply
    if reply.events is None:
        try:
            return Reply(body=messages_response(reply.body))
        except ReplyError as error:
            return Reply(status=error.status, body=error.body)
    stream = MessagesStream()
    events: list[Any] = []
    for event in reply.events:
        converted_events = stream.chunk(event) if isinstance(event, dict) else stream.done()
        events += [data for _, data in converted_events]
    return Reply(events=events, named_events=True)


def count_tokens(engine: Engine, body: dict[str, Any]) -> Reply:
    """`POST /v1/messages/count_tokens`: the rendered prompt's length (`input_tokens`)."""
    converted = _chat_body({**body, "max_tokens": 1})
    if isinstance(converted, Reply):
        return converted
    rendered = engine.tokenize({"model": converted["model"], "messages": converted["messages"]})
    if rendered.status != 200:
        return rendered
    return Reply(body={"input_tokens": rendered.body["count"]})
