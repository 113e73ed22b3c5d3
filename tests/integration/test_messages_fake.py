"""Anthropic Messages capture on the fake vLLM, driven by the official `anthropic` SDK in process:
one exact chat call per Messages call, the caller's view equal to the fake's own `/v1/messages`,
errors and what capture cannot convert passed through, the server's conversion choices probed once,
token-in sessions and merged assembly on Messages calls.

The fake answers `/v1/messages` with the library's own conversion around its chat endpoint (see
`tito_agents.testing.fake_vllm._messages`): these tests check capture's plumbing; the conversion is
checked against vLLM's converters (tests/unit/test_messages_wire.py) and the real server
(tests/e2e/test_messages_real.py)."""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import anthropic
import numpy as np
import pytest

import tito_agents as tito
from tests.support.sessions_fake import extends, responder
from tito_agents.calls import CallStatus, Endpoint, SessionNote
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeResponse, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
HTTP = importlib.import_module(
    next(
        root
        for klass in anthropic.DefaultHttpxClient.__mro__
        if (root := klass.__module__.split(".")[0]) in ("httpx", "httpx2")
    )
)
"""The HTTP library the installed anthropic SDK builds its clients on (httpx2 from 2.x)."""
USER: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
Hook = Callable[[str, bytes], FakeResponse | None]


@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=responder))


def transport(fake: FakeVLLM, paths: list[str] | None = None, hook: Hook | None = None) -> Any:
    def handle(method: str, path: str, body: bytes, headers: Mapping[str, str]) -> FakeResponse:
        if paths is not None:
            paths.append(path)
        answered = hook(path, body) if hook is not None else None
        return answered or fake.handle(method, path, body, headers)

    return mock_transport(handle, http=HTTP)


def client_of(fake: FakeVLLM, **kwargs: Any) -> anthropic.Anthropic:
    http = anthropic.DefaultHttpxClient(transport=transport(fake, **kwargs))
    return anthropic.Anthropic(base_url="http://vllm.test", api_key="x", http_client=http)


def async_client_of(fake: FakeVLLM) -> anthropic.AsyncAnthropic:
    http = anthropic.DefaultAsyncHttpxClient(transport=transport(fake))
    return anthropic.AsyncAnthropic(base_url="http://vllm.test", api_key="x", http_client=http)


def ids_out(data: Any) -> Any:
    """`data` with every id (the response's, each tool_use's: fresh per response) and thinking
    signature (a fresh uuid) replaced by a mark."""
    if isinstance(data, dict):
        return {k: "<fresh>" if k in ("id", "signature") else ids_out(v) for k, v in data.items()}
    if isinstance(data, list):
        return [ids_out(v) for v in data]
    return data


def view(message: Any) -> Any:
    """What the caller sees, fresh ids aside."""
    return ids_out(message.model_dump())


def events_of(stream: Any) -> list[Any]:
    return [ids_out(event.model_dump()) for event in stream]


def exact(call: tito.Call) -> None:
    assert call.status is CallStatus.COMPLETE, call.error
    assert call.endpoint is Endpoint.CHAT and call.translated_from == "messages"
    assert call.prompt_ids.size and call.sampled_ids.size


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["text", "tools"])
def test_create_and_stream_are_exact_calls_and_answer_as_the_server(
    fake: FakeVLLM, tools: Any
) -> None:
    """`messages.create` and `messages.stream`, with and without tools: one exact chat call each,
    and the caller gets what the server's own `/v1/messages` answers (blocks, tool_use, stop
    reason, usage, every stream event in order)."""
    plain, captured = client_of(fake), client_of(fake)
    collector = tito.Collector()
    collector.wrap(captured)
    extra = {"tools": tools} if tools else {}
    request: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=64, messages=USER, **extra)
    with collector.episode() as ep:
        body = captured.messages.create(**request)
        with captured.messages.stream(**request) as stream:
            events = events_of(stream)
    assert view(body) == view(plain.messages.create(**request))
    with plain.messages.stream(**request) as stream:
        assert events == events_of(stream)
    if tools:
        assert body.stop_reason == "tool_use"
        (use,) = [block for block in body.content if block.type == "tool_use"]
        assert use.name == "get_weather" and use.input == {"city": "Paris"}
    created, streamed = ep.calls
    if tools:  # each tool_use block noted on its call, as the model wrote its arguments
        for call in (created, streamed):
            assert call.tool_calls is not None and len(call.tool_calls) == 1
            assert call.tool_calls[0]["name"] == "get_weather"
            assert json.loads(call.tool_calls[0]["arguments"]) == {"city": "Paris"}
        assert created.tool_calls[0]["call_id"] == use.id  # type: ignore[index]
    else:
        assert created.tool_calls is None and streamed.tool_calls is None
    for call in ep.calls:
        exact(call)
        assert call.sampling["max_tokens"] == 64
    assert not created.stream and streamed.stream
    assert np.array_equal(created.prompt_ids, streamed.prompt_ids)
    assert body.usage.input_tokens == created.prompt_ids.size
    assert body.usage.output_tokens == created.sampled_ids.size
    assert collector.stats.uncaptured_requests == 0


def test_async_client_create_and_stream(fake: FakeVLLM) -> None:
    collector = tito.Collector()
    client = collector.wrap(async_client_of(fake))

    async def main() -> tuple[Any, Any]:
        with collector.episode() as ep:
            body = await client.messages.create(
                model=MODEL_NAME, max_tokens=64, messages=USER, tools=TOOLS
            )
            async with client.messages.stream(
                model=MODEL_NAME, max_tokens=64, messages=USER, tools=TOOLS
            ) as stream:
                final = await stream.get_final_message()
        await client.close()
        return ep, (body, final)

    ep, (body, final) = asyncio.run(main())
    assert view(body) == view(final) and body.stop_reason == "tool_use"
    assert len(ep.calls) == 2
    for call in ep.calls:
        exact(call)


def test_what_capture_cannot_convert_or_the_chat_endpoint_refuses_gets_the_servers_answer(
    fake: FakeVLLM,
) -> None:
    """A request the conversion leaves to the server goes to `/v1/messages` as written
    (uncaptured, counted); one the chat endpoint refuses is sent again to `/v1/messages`, so the
    caller gets the server's own Messages error; neither is a call."""
    paths: list[str] = []
    client = client_of(fake, paths=paths)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL_NAME, max_tokens=0, messages=USER)
        assert paths == ["/v1/messages"]
        paths.clear()
        with pytest.raises(anthropic.NotFoundError) as refused:
            client.messages.create(model="no-such-model", max_tokens=8, messages=USER)
        assert paths == ["/v1/chat/completions", "/v1/messages"]
    assert "no-such-model" in str(refused.value)
    assert ep.calls == []
    assert collector.stats.uncaptured_requests == 1 and collector.stats.failed_attempts == 1


def test_a_server_error_is_answered_in_the_messages_shape_and_not_sent_again(
    fake: FakeVLLM,
) -> None:
    """A 5xx of the chat endpoint (overloaded, engine gone) is not sent again to `/v1/messages`
    (twice the load, an uncaptured answer): the caller gets it in vLLM's Messages error shape,
    and the SDK's own retry is captured."""
    paths: list[str] = []
    client = client_of(fake, paths=paths)
    collector = tito.Collector()
    collector.wrap(client)
    fake.fail_next(1, status=503)
    with collector.episode() as ep:
        with pytest.raises(anthropic.InternalServerError) as failed:
            client.with_options(max_retries=0).messages.create(
                model=MODEL_NAME, max_tokens=8, messages=USER
            )
        assert failed.value.status_code == 503
        body: Any = failed.value.body
        assert body["type"] == "error" and body["error"]["type"] == "ServiceUnavailableError"
        assert set(body["error"]) == {"type", "message"}
        fake.fail_next(1, status=503)
        client.with_options(max_retries=1).messages.create(
            model=MODEL_NAME, max_tokens=8, messages=USER
        )
    assert paths == ["/v1/chat/completions"] * 3
    assert [call.status for call in ep.calls] == [CallStatus.COMPLETE]
    assert collector.stats.failed_attempts == 2


def test_inline_system_and_disabled_thinking_are_probed_once_per_server_and_model(
    fake: FakeVLLM,
) -> None:
    """The server's own conversion choices are asked once, by the first request that needs
    each: `count_tokens` against `/tokenize` (inline system messages), `/tokenize` of the
    effort probes (`thinking: disabled`); other requests run no probe."""
    paths: list[str] = []
    client = client_of(fake, paths=paths)
    collector = tito.Collector()
    collector.wrap(client)
    inline: list[Any] = [*USER, {"role": "system", "content": "Answer briefly."}]
    with collector.episode() as ep:
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=USER)
        assert paths == ["/v1/chat/completions"]
        for _ in range(2):
            client.messages.create(model=MODEL_NAME, max_tokens=8, messages=inline)
            client.messages.create(
                model=MODEL_NAME, max_tokens=8, messages=USER, thinking={"type": "disabled"}
            )
    assert paths.count("/v1/messages/count_tokens") == 1
    assert paths.count("/tokenize") == 2 + 6  # the two merge renders, the six effort renders
    assert paths.count("/v1/chat/completions") == 5 and "/v1/messages" not in paths
    assert len(ep.calls) == 5
    for call in ep.calls:
        exact(call)


def test_a_failed_probe_leaves_requests_that_need_it_to_the_server(fake: FakeVLLM) -> None:
    paths: list[str] = []

    def no_count(path: str, body: bytes) -> FakeResponse | None:
        return FakeResponse(404, [], body=b"{}") if path.endswith("count_tokens") else None

    client = client_of(fake, paths=paths, hook=no_count)
    collector = tito.Collector()
    collector.wrap(client)
    inline: list[Any] = [*USER, {"role": "system", "content": "Answer briefly."}]
    with collector.episode() as ep:
        for _ in range(2):
            reply = client.messages.create(model=MODEL_NAME, max_tokens=8, messages=inline)
            assert reply.content
    assert paths.count("/v1/messages/count_tokens") == 1  # not asked again
    assert paths.count("/v1/messages") == 2 and ep.calls == []
    assert collector.stats.uncaptured_requests == 2


def tool_loop(client: anthropic.Anthropic, turns: int = 3) -> None:
    """An agent loop on the Messages API that appends only (tool_use, tool_result, answer)."""
    messages: list[Any] = list(USER)
    for _ in range(turns):
        reply = client.messages.create(
            model=MODEL_NAME, max_tokens=64, messages=messages, tools=TOOLS
        )
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses:
            return
        results = [{"type": "tool_result", "tool_use_id": u.id, "content": "18C"} for u in uses]
        messages.append({"role": "user", "content": results})


def test_token_in_sessions_and_merged_assembly_on_messages_calls() -> None:
    """Messages calls are chat calls to sessions and assembly: an append-only tool loop is
    token-in after its first turn and merges into one exact sample."""
    fake = FakeVLLM(FakeConfig(responder=responder, tokenization="drift"))
    collector = tito.Collector(assembly="merged", tokenizer=load_tokenizer())
    client = client_of(fake)
    collector.wrap(client, sessions=True)
    with collector.episode() as ep, tito.agent("solver"):
        tool_loop(client)
    calls = sorted(ep.calls, key=lambda c: c.seq)
    assert len(calls) == 2
    assert calls[0].session == SessionNote.FIRST
    assert calls[1].session == SessionNote.TOKEN_IN, calls[1].session_reason
    assert extends(calls[0], calls[1])
    (sample,) = captured_samples(collector)
    assert np.array_equal(sample.token_ids, calls[-1].token_ids)
    trained = np.concatenate([c.sampled_ids for c in calls])
    assert np.array_equal(sample.token_ids[sample.loss_mask.astype(bool)], trained)


def test_count_tokens_and_other_hosts_are_not_captured(fake: FakeVLLM) -> None:
    paths: list[str] = []
    client = client_of(fake, paths=paths)
    collector = tito.Collector()
    collector.wrap(client, vllm_hosts=["other.test"])
    with collector.episode() as ep:
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=USER)
    assert paths == ["/v1/messages"] and ep.calls == []
    collector.wrap(client)
    with collector.episode() as ep:
        counted = client.messages.count_tokens(model=MODEL_NAME, messages=USER)
    assert counted.input_tokens > 0 and ep.calls == []
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        tito.Collector().wrap(anthropic.Anthropic(api_key="x"))


def test_the_chat_request_sent_is_vllms_conversion(fake: FakeVLLM) -> None:
    """What goes to `/v1/chat/completions`: the conversion, with ids asked for (the caller's
    query, Claude Code's `?beta=true`, stays off it)."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def keep(path: str, body: bytes) -> None:
        sent.append((path, json.loads(body)))
        return None

    client = client_of(fake, hook=keep)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode():
        client.messages.create(
            model=MODEL_NAME,
            max_tokens=8,
            system="Be brief.",
            messages=USER,
            stop_sequences=["."],
            extra_query={"beta": "true"},
        )
    ((path, body),) = sent
    assert path == "/v1/chat/completions"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert body["return_token_ids"] is True and body["stop"] == ["."]
    assert body["max_tokens"] == body["max_completion_tokens"] == 8


def test_the_sdk_tool_example_pattern_round_trips_the_sdks_own_blocks(fake: FakeVLLM) -> None:
    """The anthropic SDK's tool examples (examples/tools.py, tools_stream.py) as they are written,
    base URL and model aside: the answer's content objects are sent back as the assistant turn,
    a tool_result follows, and a stream's `input_json` events give the arguments as they grow."""
    collector = tito.Collector()
    client = collector.wrap(client_of(fake))
    user_message: Any = {"role": "user", "content": "What is the weather in SF?"}
    tools: Any = [
        {
            "name": "get_weather",
            "description": "Get the weather for a specific location",
            "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}},
        }
    ]
    with collector.episode() as ep:
        message = client.messages.create(
            model=MODEL_NAME, max_tokens=1024, messages=[user_message], tools=tools
        )
        assert message.stop_reason == "tool_use"
        tool = next(c for c in message.content if c.type == "tool_use")
        result: Any = {"type": "tool_result", "tool_use_id": tool.id, "content": "73f"}
        turns: Any = [
            user_message,
            {"role": message.role, "content": message.content},
            {"role": "user", "content": [result]},
        ]
        response = client.messages.create(
            model=MODEL_NAME,
            max_tokens=1024,
            messages=turns,
            tools=tools,
        )
        with client.messages.stream(
            max_tokens=1024, model=MODEL_NAME, tools=tools, messages=[user_message]
        ) as stream:
            snapshots = [event.snapshot for event in stream if event.type == "input_json"]
    assert response.stop_reason == "end_turn" and response.content[0].type == "text"
    assert snapshots and snapshots[-1] == {"city": "Paris"}
    assert [call.status for call in ep.calls] == [CallStatus.COMPLETE] * 3
