"""The fake in process: `mock_transport` streams, waits, cuts and counts as the HTTP server does."""

from __future__ import annotations

import json
import time
import types
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import openai
import pytest

from tests.support.fake_vllm_calls import MESSAGES, parse_sse
from tito_agents.testing import FakeConfig, FakeResponse, FakeVLLM, mock_transport
from tito_agents.testing.fake_vllm._mock import openai_http_module
from tito_agents.testing.smollm2 import MODEL_NAME

HTTP = openai_http_module()
URL = "http://vllm.test/v1/chat/completions"
CHAT = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 8}


def fresh(**faults: Any) -> FakeVLLM:
    """A fake of its own, for tests that set faults or read stats."""
    fake = FakeVLLM(FakeConfig(responder=lambda view: "It is sunny in Paris today."))
    for name, value in faults.items():
        setattr(fake.faults, name, value)
    return fake


def test_the_default_library_is_the_one_openai_builds_on(fake: FakeVLLM) -> None:
    """`openai.DefaultHttpxClient(transport=mock_transport(fake))` needs no `http=`."""
    transport = mock_transport(fake)
    assert isinstance(transport, HTTP.BaseTransport)
    assert isinstance(transport, HTTP.AsyncBaseTransport)
    assert isinstance(mock_transport(fake, http=httpx), httpx.BaseTransport)


@pytest.mark.parametrize("module", sorted({httpx, HTTP}, key=str), ids=lambda m: m.__name__)
def test_a_body_arrives_whole_with_its_length(fake: FakeVLLM, module: types.ModuleType) -> None:
    with module.Client(transport=mock_transport(fake, http=module)) as client:
        response = client.post(URL, json=CHAT)
    assert response.status_code == 200
    assert response.headers["content-length"] == str(len(response.content))
    assert response.json()["choices"][0]["message"]["content"]


def test_a_stream_arrives_event_by_event_as_the_fake_makes_them() -> None:
    """Each chunk the client reads is one SSE event, produced only when the client asks for it
    (not read whole first), and the response is chunked as the server's is."""
    fake, produced = fresh(), [0]

    def counting(method: str, target: str, body: bytes, headers: Mapping[str, str]) -> Any:
        answer = fake.handle(method, target, body, headers)
        inner = answer.stream
        assert inner is not None

        async def events() -> AsyncIterator[bytes]:
            async for event in inner:
                produced[0] += 1
                yield event

        answer.stream = events()
        return answer

    with (
        HTTP.Client(transport=mock_transport(counting)) as client,
        client.stream("POST", URL, json={**CHAT, "stream": True}) as response,
    ):
        assert response.headers["transfer-encoding"] == "chunked"
        chunks = response.iter_raw()
        first = next(chunks)
        assert produced[0] == 1
        rest = list(chunks)
    assert [first, *rest] == [c for c in [first, *rest] if c.endswith(b"\n\n")]
    assert produced[0] == len(rest) + 1
    assert parse_sse(b"".join([first, *rest]))[-1] == "[DONE]"


async def test_an_async_client_streams_the_same_events() -> None:
    fake = fresh()
    async with (
        HTTP.AsyncClient(transport=mock_transport(fake)) as client,
        client.stream("POST", URL, json={**CHAT, "stream": True}) as response,
    ):
        chunks = [chunk async for chunk in response.aiter_raw()]
    events = parse_sse(b"".join(chunks))
    assert len(chunks) == len(events) > 2 and events[-1] == "[DONE]"
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]
    )
    assert text == "It is sunny in Paris today."
    assert fake.stats.disconnects == 0


def test_openai_sync_and_async_clients_read_it(fake: FakeVLLM) -> None:
    transport = mock_transport(fake)
    client = openai.OpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        http_client=openai.DefaultHttpxClient(transport=transport),
    )
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=8, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    whole = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=8)
    assert streamed == whole.choices[0].message.content


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_cut_stream_is_a_protocol_error_mid_body(asynchronous: bool) -> None:
    """`cut_stream_after` ends the body without its last chunk: the HTTP library's
    RemoteProtocolError after the events that were sent, counted as a cut, not a disconnect."""
    fake = fresh(cut_stream_after=2)
    got: list[bytes] = []
    with pytest.raises(HTTP.RemoteProtocolError, match="incomplete chunked read"):
        if asynchronous:
            async with (
                HTTP.AsyncClient(transport=mock_transport(fake)) as aclient,
                aclient.stream("POST", URL, json={**CHAT, "stream": True}) as response,
            ):
                async for chunk in response.aiter_raw():
                    got.append(chunk)
        else:
            with (
                HTTP.Client(transport=mock_transport(fake)) as client,
                client.stream("POST", URL, json={**CHAT, "stream": True}) as response,
            ):
                for chunk in response.iter_raw():
                    got.append(chunk)
    assert len(got) == 2
    assert (fake.stats.cut_streams, fake.stats.disconnects) == (1, 0)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_closing_before_done_is_a_disconnect(asynchronous: bool) -> None:
    fake = fresh()
    if asynchronous:
        async with (
            HTTP.AsyncClient(transport=mock_transport(fake)) as aclient,
            aclient.stream("POST", URL, json={**CHAT, "stream": True}) as response,
        ):
            await anext(aiter(response.aiter_raw()))
    else:
        with (
            HTTP.Client(transport=mock_transport(fake)) as client,
            client.stream("POST", URL, json={**CHAT, "stream": True}) as response,
        ):
            next(response.iter_raw())
    assert fake.stats.disconnects == 1


def test_latency_is_waited_before_the_response() -> None:
    fake = fresh(latency_ms=80)
    with HTTP.Client(transport=mock_transport(fake)) as client:
        start = time.perf_counter()
        assert client.get("http://vllm.test/health").status_code == 200
    assert time.perf_counter() - start >= 0.08


def test_headers_and_query_reach_the_fake(fake: FakeVLLM) -> None:
    """A per-request fault header works in process, and a query string does not change the route."""
    with HTTP.Client(transport=mock_transport(fake)) as client:
        refused = client.post(URL, json=CHAT, headers={"x-fake-fault": "status_before_body=503"})
        models = client.get("http://vllm.test/v1/models?limit=1")
    assert refused.status_code == 503
    assert json.loads(refused.content)["error"]["code"] == 503
    assert models.json()["data"][0]["id"] == MODEL_NAME


def test_a_handler_can_stand_between_the_client_and_the_fake(fake: FakeVLLM) -> None:
    """Any `(method, target, body, headers) -> FakeResponse` works: here, a server without
    /tokenize in front of the fake."""

    def no_tokenize(method: str, target: str, body: bytes, headers: Mapping[str, str]) -> Any:
        if target == "/tokenize":
            return FakeResponse(404, [("content-type", "application/json")], b'{"detail":"x"}')
        return fake.handle(method, target, body, headers)

    with HTTP.Client(transport=mock_transport(no_tokenize)) as client:
        assert client.post("http://vllm.test/tokenize", json={"prompt": "hi"}).status_code == 404
        assert client.post("http://vllm.test/detokenize", json={"tokens": [1]}).status_code == 200
