"""Bad inputs: missing or inconsistent ids, malformed bodies, broken and abandoned streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest

import tito_agents as tito
from tests.support.capture_replay import (
    MSG,
    Capture,
    Replay,
    load_capture,
    replay_clients,
    run_async,
    run_sync,
    streamed_ids,
)
from tito_agents.testing import captured_samples


def with_body(cap: Capture, body: bytes) -> Capture:
    return Capture(cap.name + "-edited", cap.path, cap.request, cap.status, body)


def edit_json(cap: Capture, edit: Any) -> Capture:
    body = cap.json()
    edit(body)
    return with_body(cap, json.dumps(body).encode())


def edit_stream(cap: Capture, edit: Any) -> Capture:
    """Apply `edit(list_of_chunk_dicts)` to the JSON events of a streaming capture."""
    chunks = []
    for event in cap.events():
        data = event.strip()[len(b"data: ") :]
        chunks.append(data if data == b"[DONE]" else json.loads(data))
    edit(chunks)
    out = b""
    for c in chunks:
        out += b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n"
    return with_body(cap, out)


def collect(cap: Capture, **collector_kwargs: Any) -> tuple[tito.Collector, Any]:
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False, **collector_kwargs)
    collector.wrap(client)
    return collector, client


def test_missing_ids_raise_at_episode_end_after_good_samples() -> None:
    """Default policy: the agent's call succeeds, good calls are written, the episode exit raises."""
    good, bad = load_capture("chat_ns"), load_capture("chat_ns_plain")
    client, _ = replay_clients(Replay([good, bad]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with pytest.raises(tito.EpisodeCaptureError) as info, collector.episode("e1"):
        run_sync(client, good)
        response = run_sync(client, bad)
        assert response.choices[0].message.content == bad.json()["choices"][0]["message"]["content"]
    assert isinstance(info.value.errors[0], tito.MissingTokenIdsError)
    assert "vLLM >= 0.10.2" in str(info.value)
    assert len(captured_samples(collector)) == 1
    assert collector.stats.unusable_calls == 1


def test_missing_ids_are_counted_in_lenient_mode() -> None:
    """Lenient policy: nothing raises; the call is recorded unusable and counted, never sampled."""
    collector, client = collect(load_capture("chat_ns_plain"), errors="count")
    with collector.episode() as ep:
        run_sync(client, load_capture("chat_ns_plain"))
    assert ep.calls[0].status is tito.CallStatus.UNUSABLE
    assert collector.stats.unusable_calls == 1
    assert ep.report.unusable == 1
    assert captured_samples(collector) == []


def test_strict_mode_fails_the_call_with_the_typed_error() -> None:
    """Strict policy: the agent's own call fails; the typed error is the cause."""
    collector, client = collect(load_capture("chat_ns_plain"), errors="raise")
    with collector.episode(), pytest.raises(tito.MissingTokenIdsError):
        client.chat.completions.create(model="tiny", messages=MSG)


async def test_strict_mode_fails_a_stream_during_iteration() -> None:
    """Strict policy on a stream: iteration raises the typed error itself."""
    cap = edit_stream(load_capture("chat_stream"), lambda cs: cs[0].pop("prompt_token_ids"))
    _, client = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False, errors="raise")
    collector.wrap(client)
    async with collector.episode():
        with pytest.raises(tito.MissingTokenIdsError):
            await run_async(client, cap)


def test_include_reasoning_false_names_the_cause() -> None:
    """vLLM 0.32 nulls token_ids with include_reasoning=false: the error says so and how to fix."""
    cap = load_capture("chat_include_reasoning_false")
    collector, client = collect(cap, errors="count")
    with collector.episode() as ep:
        run_sync(client, cap)
    assert "include_reasoning=false" in str(ep.calls[0].error)


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (
            lambda b: b["choices"][0].__setitem__("token_ids", [448, 1.5, 2]),
            tito.errors.MalformedResponseError,
        ),
        (
            lambda b: b["choices"][0].__setitem__("token_ids", ["448", 316, 2]),
            tito.errors.MalformedResponseError,
        ),
        (
            lambda b: b["choices"][0].__setitem__("token_ids", [448, -1, 2]),
            tito.errors.MalformedResponseError,
        ),
        (lambda b: b.__setitem__("prompt_token_ids", "1,2,3"), tito.errors.MalformedResponseError),
        (
            lambda b: b["choices"][0]["logprobs"]["content"].pop(),
            tito.errors.TokenCountMismatchError,
        ),
        (
            lambda b: b["usage"].__setitem__("completion_tokens", 7),
            tito.errors.TokenCountMismatchError,
        ),
    ],
    ids=["float-id", "string-id", "negative-id", "prompt-not-list", "logprobs-short", "usage"],
)
def test_inconsistent_bodies_are_typed_errors(edit: Any, error: type[Exception]) -> None:
    """Non-integer ids and length mismatches make the call unusable with a typed error."""
    cap = edit_json(load_capture("eos"), edit)
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True, errors="count")
    collector.wrap(client)
    with collector.episode() as ep:
        client.chat.completions.create(model="tiny", messages=MSG)
    assert isinstance(ep.calls[0].error, error)
    assert ep.calls[0].status is tito.CallStatus.UNUSABLE


def test_streamed_ids_must_match_usage() -> None:
    """A stream that lost a chunk's ids disagrees with usage.completion_tokens: typed error."""
    cap = edit_stream(
        load_capture("chat_stream"), lambda cs: cs[2]["choices"][0].__setitem__("token_ids", [])
    )
    collector, client = collect(cap, errors="count")
    with collector.episode() as ep:
        chunks = run_sync(client, cap)
    assert len(chunks) == 5  # the caller still got every chunk
    assert isinstance(ep.calls[0].error, tito.errors.TokenCountMismatchError)


def test_malformed_json_body_is_recorded() -> None:
    """A 200 with a body that is not JSON: the SDK fails on its own; capture records it unusable."""
    cap = with_body(load_capture("chat_ns"), b'{"id": "x", "choices": [')
    collector, client = collect(cap, errors="count")
    with pytest.raises(Exception), collector.episode():  # noqa: B017 - the SDK's own error
        client.chat.completions.create(model="tiny", messages=MSG)
    assert collector.stats.unusable_calls == 1


def test_malformed_sse_event_is_recorded() -> None:
    """An SSE event with broken JSON makes the call unusable; earlier chunks reached the caller."""
    cap = load_capture("chat_stream")
    events = cap.events()
    events[2] = b'data: {"choices": [\n\n'
    broken = with_body(cap, b"".join(events))
    collector, client = collect(broken, errors="count")
    seen = []
    with pytest.raises(Exception), collector.episode():  # noqa: B017 - the SDK's own error
        for chunk in client.chat.completions.create(model="tiny", messages=MSG, stream=True):
            seen.append(chunk)
    assert len(seen) == 2
    assert collector.stats.unusable_calls == 1


def test_sse_with_crlf_and_comments_is_parsed() -> None:
    """CRLF line ends, keep-alive comments and split chunks do not change the captured ids."""
    cap = load_capture("chat_stream")
    text = b"".join(b": keep-alive\r\n\r\n" + e.replace(b"\n", b"\r\n") for e in cap.events())
    crlf = with_body(cap, text)
    collector, client = collect(crlf)
    with collector.episode() as ep:
        run_sync(client, crlf)
    assert ep.calls[0].status is tito.CallStatus.COMPLETE
    assert ep.calls[0].sampled_ids.tolist() == [448, 316, 448]


def test_abandoned_stream_is_incomplete() -> None:
    """A caller that stops reading and closes the stream leaves an incomplete call, no sample."""
    cap = load_capture("chat_stream")
    collector, client = collect(cap)
    with collector.episode() as ep:
        stream = client.chat.completions.create(model="tiny", messages=MSG, stream=True)
        next(iter(stream))
        stream.close()
    assert ep.calls[0].status is tito.CallStatus.INCOMPLETE
    assert isinstance(ep.calls[0].error, tito.errors.IncompleteCallError)
    assert captured_samples(collector) == []
    assert collector.stats.incomplete_calls == 1


def test_stream_without_done_is_incomplete() -> None:
    """A stream that ends without [DONE] (cut by a proxy) is never a complete sample."""
    cap = load_capture("chat_stream")
    cut = with_body(cap, b"".join(cap.events()[:3]))
    collector, client = collect(cut)
    with collector.episode() as ep:
        run_sync(client, cut)
    assert ep.calls[0].status is tito.CallStatus.INCOMPLETE
    assert captured_samples(collector) == []


async def test_cancelled_stream_is_incomplete() -> None:
    """Cancelling the task that reads a stream records the call as incomplete."""
    cap = load_capture("chat_stream")
    events = cap.events()
    release = asyncio.Event()

    async def handler(request: httpx2.Request) -> httpx2.Response:
        async def body() -> AsyncIterator[bytes]:
            yield events[0]
            yield events[1]
            await release.wait()  # never set: the reader is cancelled here
            for e in events[2:]:
                yield e

        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    client = openai.AsyncOpenAI(
        base_url="http://vllm.test:8000/v1",
        api_key="x",
        http_client=openai.DefaultAsyncHttpxClient(transport=httpx2.MockTransport(handler)),
    )
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    got = asyncio.Event()

    async def reader() -> None:
        stream = await client.chat.completions.create(model="tiny", messages=MSG, stream=True)
        try:
            async for _ in stream:
                got.set()
        finally:
            await stream.close()

    async with collector.episode() as ep:
        task = asyncio.create_task(reader())
        await got.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert ep.calls[0].status is tito.CallStatus.INCOMPLETE
    assert ep.report.incomplete == 1


def body_transport(
    cap: Capture, *, gzip_it: bool, chunks: int
) -> tuple[httpx2.MockTransport, httpx2.MockTransport]:
    """A server that answers `cap` compressed although capture asked for `identity`, and/or in
    several chunks."""
    import gzip

    body = gzip.compress(cap.body) if gzip_it else cap.body
    headers = {"content-type": "application/json"}
    if gzip_it:
        headers["content-encoding"] = "gzip"
    size = -(-len(body) // chunks)
    pieces = [body[i : i + size] for i in range(0, len(body), size)]

    async def agen() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(cap.status, headers=headers, content=iter(pieces))

    async def ahandler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(cap.status, headers=headers, content=agen())

    return httpx2.MockTransport(handler), httpx2.MockTransport(ahandler)


@pytest.mark.parametrize("gzip_it, chunks", [(True, 1), (True, 5), (False, 5)])
async def test_compressed_or_chunked_bodies_are_captured_and_handed_on(
    gzip_it: bool, chunks: int
) -> None:
    """The caller gets the decoded response (without the ids it did not ask for); the call keeps
    the exact ids, sync and async."""
    cap = load_capture("chat_ns")
    want = cap.json()
    sync_t, async_t = body_transport(cap, gzip_it=gzip_it, chunks=chunks)
    collector = tito.Collector(capture_logprobs=False)
    sync = collector.wrap(
        openai.OpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultHttpxClient(transport=sync_t),
        )
    )
    asyn = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=async_t),
        )
    )
    with collector.episode() as sync_ep:  # one each: the same response id twice is one call
        got = [sync.chat.completions.create(model="m", messages=MSG)]  # type: ignore[arg-type]
    async with collector.episode() as async_ep:
        got.append(await asyn.chat.completions.create(model="m", messages=MSG))  # type: ignore[arg-type]
    for response in got:
        assert response.choices[0].message.content == want["choices"][0]["message"]["content"]
        assert response.model_extra["prompt_token_ids"] is None  # type: ignore[index]
    calls = sync_ep.calls + async_ep.calls
    assert [c.status for c in calls] == [tito.CallStatus.COMPLETE] * 2
    for call in calls:
        assert call.prompt_ids.tolist() == want["prompt_token_ids"]
        assert call.sampled_ids.tolist() == want["choices"][0]["token_ids"]


async def test_a_response_the_inner_transport_already_read_is_captured() -> None:
    """A transport below capture that read the body itself (its one-shot stream is spent) still
    gives the caller its response and the call its ids, sync and async."""
    cap = load_capture("chat_ns")
    want = cap.json()

    def read_response() -> httpx2.Response:
        response = httpx2.Response(
            200, headers={"content-type": "application/json"}, content=iter([cap.body])
        )
        response.read()
        return response

    async def aread_response() -> httpx2.Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield cap.body

        response = httpx2.Response(
            200, headers={"content-type": "application/json"}, content=chunks()
        )
        await response.aread()
        return response

    async def ahandler(request: httpx2.Request) -> httpx2.Response:
        return await aread_response()

    collector = tito.Collector(capture_logprobs=False)
    sync = collector.wrap(
        openai.OpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultHttpxClient(
                transport=httpx2.MockTransport(lambda request: read_response())
            ),
        )
    )
    asyn = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=httpx2.MockTransport(ahandler)),
        )
    )
    with collector.episode() as sync_ep:
        got = [sync.chat.completions.create(model="m", messages=MSG)]  # type: ignore[arg-type]
    async with collector.episode() as async_ep:
        got.append(await asyn.chat.completions.create(model="m", messages=MSG))  # type: ignore[arg-type]
    for response in got:
        assert response.choices[0].message.content == want["choices"][0]["message"]["content"]
    for call in sync_ep.calls + async_ep.calls:
        assert call.status is tito.CallStatus.COMPLETE
        assert call.sampled_ids.tolist() == want["choices"][0]["token_ids"]


def encoded_stream_transports(
    cap: Capture, encoding: str
) -> tuple[httpx2.MockTransport, httpx2.MockTransport]:
    """A server that compresses an SSE stream although capture asked for `identity` (a proxy
    gzipping text/event-stream), flushing the compressor after each event as a streaming proxy
    does. `encoding` is the content-encoding header; "x-unknown" sends the body as it is."""
    import zlib

    wbits = {"gzip": 31, "deflate": 15}  # deflate as HTTP means it: zlib-wrapped
    names = [e.strip() for e in encoding.split(",")]
    layers = [zlib.compressobj(wbits=wbits[name]) for name in names if name in wbits]
    pieces = []
    for event in cap.events():
        for layer in layers:
            event = layer.compress(event) + layer.flush(zlib.Z_SYNC_FLUSH)
        pieces.append(event)
    tail = b""
    for layer in layers:
        tail = layer.compress(tail) + layer.flush()
    pieces.append(tail)
    headers = {"content-type": "text/event-stream", "content-encoding": encoding}

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers=headers, content=iter(pieces))

    async def ahandler(request: httpx2.Request) -> httpx2.Response:
        async def agen() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return httpx2.Response(200, headers=headers, content=agen())

    return httpx2.MockTransport(handler), httpx2.MockTransport(ahandler)


def stream_clients(
    transports: tuple[httpx2.MockTransport, httpx2.MockTransport], collector: tito.Collector
) -> tuple[Any, Any]:
    """A sync and an async openai client on `transports`, wrapped by `collector`."""
    sync_t, async_t = transports
    sync = openai.OpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        http_client=openai.DefaultHttpxClient(transport=sync_t),
    )
    asyn = openai.AsyncOpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        http_client=openai.DefaultAsyncHttpxClient(transport=async_t),
    )
    return collector.wrap(sync), collector.wrap(asyn)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "gzip, deflate"])
async def test_a_compressed_stream_is_captured_and_the_caller_decodes_its_own(
    encoding: str,
) -> None:
    """A server that compresses a stream although capture asked for `identity`: the call is read
    through the same decoders (sync and async) and recorded complete with the exact ids; the
    caller's chunks are what it gets from the uncompressed stream."""
    cap = load_capture("chat_stream")
    prompt, sampled = streamed_ids(cap)
    collector = tito.Collector(capture_logprobs=False, errors="raise")
    plain_sync, _ = stream_clients(encoded_stream_transports(cap, "identity"), collector)
    sync, asyn = stream_clients(encoded_stream_transports(cap, encoding), collector)
    with collector.episode():
        want = [
            c.model_dump()
            for c in plain_sync.chat.completions.create(model="m", messages=MSG, stream=True)
        ]
    with collector.episode() as sync_ep:
        got = [
            c.model_dump()
            for c in sync.chat.completions.create(model="m", messages=MSG, stream=True)
        ]
    async with collector.episode() as async_ep:
        stream = await asyn.chat.completions.create(model="m", messages=MSG, stream=True)
        got_async = [c.model_dump() async for c in stream]
    assert got == want and got_async == want
    for call in sync_ep.calls + async_ep.calls:
        assert call.status is tito.CallStatus.COMPLETE
        assert call.prompt_ids.tolist() == prompt
        assert call.sampled_ids.tolist() == sampled


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "body"])
def test_a_body_in_an_encoding_capture_cannot_decode_is_reported(stream: bool) -> None:
    """An encoding the HTTP library has no decoder for: the call is recorded unusable saying so,
    through the error policy (here the episode's exit), never as a silent incomplete call; the
    caller gets the response as it came."""
    cap = load_capture("chat_stream" if stream else "chat_ns")
    headers = {
        "content-type": "text/event-stream" if stream else "application/json",
        "content-encoding": "x-unknown",
    }
    transport = httpx2.MockTransport(
        lambda request: httpx2.Response(
            200, headers=headers, content=iter(cap.events() if stream else [cap.body])
        )
    )
    collector = tito.Collector(capture_logprobs=False)
    client: Any = collector.wrap(
        openai.OpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultHttpxClient(transport=transport),
        )
    )
    with pytest.raises(tito.EpisodeCaptureError) as info, collector.episode() as ep:
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=MSG, stream=True))
            assert len(chunks) == len(cap.events()) - 1  # every chunk but [DONE]
        else:
            response = client.chat.completions.create(model="m", messages=MSG)
            assert (
                response.choices[0].message.content
                == cap.json()["choices"][0]["message"]["content"]
            )
    (call,) = ep.calls
    assert call.status is tito.CallStatus.UNUSABLE
    assert isinstance(call.error, tito.errors.MalformedResponseError)
    assert "x-unknown" in str(call.error) and "x-unknown" in str(info.value)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "body"])
def test_boolean_ids_are_a_typed_error_and_no_sample(stream: bool) -> None:
    """`true`/`false` among the ids (here next to real ids): unusable, typed, never a sample."""
    if stream:
        cap = edit_stream(
            load_capture("chat_stream"),
            lambda cs: cs[2]["choices"][0].__setitem__("token_ids", [True]),
        )
    else:
        cap = edit_json(
            load_capture("eos"), lambda b: b["choices"][0].__setitem__("token_ids", [448, True])
        )
    collector, client = collect(cap, errors="count")
    with collector.episode() as ep:
        run_sync(client, cap)
    assert isinstance(ep.calls[0].error, tito.errors.MalformedResponseError)
    assert ep.calls[0].status is tito.CallStatus.UNUSABLE
    assert captured_samples(collector) == []
