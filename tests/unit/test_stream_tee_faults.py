"""Capture never breaks the agent's call, whatever shape the server sends: the caller reads every
chunk (or the body) exactly as the server sent it, and a shape capture cannot read makes the call
UNUSABLE with a `MalformedResponseError`, never an exception in the caller's iteration, and never
a call left in flight (after the stream ends, and after the caller closes it early)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import openai
import pytest

import tito_agents as tito
from tests.support.capture_replay import BASE_URL, MSG, load_capture
from tito_agents._capture.chat.parser import ChoicesParser
from tito_agents.errors import MalformedResponseError

Edit = Callable[[Any], None]


def tool_call(index: Any, arguments: Any) -> list[dict[str, Any]]:
    return [{"index": index, "id": "c1", "type": "function", "function": {"arguments": arguments}}]


def set_choice(chunk: int, key: str, value: Any) -> Edit:
    return lambda cs: cs[chunk]["choices"][0].__setitem__(key, value)


def set_delta_tools(*per_chunk: tuple[int, list[dict[str, Any]]]) -> Edit:
    def edit(cs: Any) -> None:
        for chunk, calls in per_chunk:
            cs[chunk]["choices"][0]["delta"]["tool_calls"] = calls

    return edit


CHAT_STREAM_FAULTS: dict[str, tuple[Edit, bool]] = {
    # name: (edit of the chunk dicts, token-in sessions on: the assistant message is kept)
    "choices-a-string": (lambda cs: cs[1].__setitem__("choices", "abc"), False),
    "choices-hold-an-int": (lambda cs: cs[1].__setitem__("choices", [1]), False),
    "index-a-list": (set_choice(1, "index", [1]), False),
    "index-0-then-a-string": (set_choice(2, "index", "a"), False),
    "index-a-bool": (set_choice(2, "index", True), False),
    "tool-arguments-an-int": (set_delta_tools((1, tool_call(0, 5))), True),
    "tool-indexes-mixed": (set_delta_tools((1, tool_call(0, "{")), (2, tool_call("a", "}"))), True),
    "tool-calls-a-string": (set_delta_tools((1, "abc")), True),  # type: ignore[arg-type]
}


def chat_events(edit: Edit) -> list[bytes]:
    """The chat_stream capture's events, `edit` applied to their JSON chunks."""
    chunks: list[Any] = []
    for event in load_capture("chat_stream").events():
        data = event.strip()[len(b"data: ") :]
        chunks.append(data if data == b"[DONE]" else json.loads(data))
    edit(chunks)
    return [
        b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n"
        for c in chunks
    ]


def responses_events(edit: Edit) -> list[bytes]:
    """The real Responses stream's events, `edit` applied to its final event's response."""
    out = []
    for event in load_capture("real/responses_stream").events():
        head, _, data = event.strip().partition(b"\ndata: ")
        if head == b"event: response.completed":
            payload = json.loads(data)
            edit(payload["response"])
            data = json.dumps(payload).encode()
        out.append(head + b"\ndata: " + data + b"\n\n")
    return out


def message_content(value: Any) -> Edit:
    return lambda r: r["output"][0].__setitem__("content", value)


def reasoning_summary(value: Any) -> Edit:
    return lambda r: r["output"].append({"type": "reasoning", "summary": value, "content": None})


RESPONSES_FAULTS: dict[str, Edit] = {
    "content-an-int": message_content(5),
    "content-a-string": message_content("abc"),
    "summary-an-int": reasoning_summary(5),
    "output-item-an-int": lambda r: r["output"].append(5),
}


def request_of(name: str) -> tuple[str, dict[str, Any]]:
    cap = load_capture(name)
    url = BASE_URL + ("/responses" if "responses" in name else "/chat/completions")
    return url, dict(cap.request)


def collector_and_handler(
    body: list[bytes] | bytes, *, asynchronous: bool
) -> tuple[tito.Collector, httpx2.MockTransport, list[str]]:
    """A lenient collector, and a transport answering every request with `body` (SSE chunks, or
    one JSON body); the paths it was asked for."""
    paths: list[str] = []

    def response() -> httpx2.Response:
        if isinstance(body, bytes):
            return httpx2.Response(200, headers={"content-type": "application/json"}, content=body)
        headers = {"content-type": "text/event-stream"}
        if asynchronous:

            async def agen() -> AsyncIterator[bytes]:
                for chunk in body:
                    yield chunk

            return httpx2.Response(200, headers=headers, content=agen())
        return httpx2.Response(200, headers=headers, content=iter(list(body)))

    def handler(request: httpx2.Request) -> httpx2.Response:
        paths.append(request.url.path)
        return response()

    async def ahandler(request: httpx2.Request) -> httpx2.Response:
        return handler(request)

    transport = httpx2.MockTransport(ahandler if asynchronous else handler)
    return tito.Collector(capture_logprobs=False, errors="count"), transport, paths


def check_unusable(ep: tito.Episode, paths: list[str]) -> None:
    assert len(paths) == 1  # one request, as the caller made it
    (call,) = ep.calls
    assert call.status is tito.CallStatus.UNUSABLE
    assert isinstance(call.error, MalformedResponseError)
    assert ep.inflight == 0


def read_sync(
    events: list[bytes], name: str, *, sessions: bool, keep: int | None
) -> tuple[list[bytes], tito.Episode, list[str]]:
    """Stream `events` to a raw captured httpx client; read `keep` chunks (all when None) and
    close. Returns the chunks the caller read."""
    collector, transport, paths = collector_and_handler(events, asynchronous=False)
    client = collector.http_client(
        ["vllm.test:8000"], asynchronous=False, sessions=sessions, transport=transport
    )
    url, payload = request_of(name)
    got: list[bytes] = []
    with collector.episode() as ep, client.stream("POST", url, json=payload) as r:
        for chunk in r.iter_raw():
            got.append(chunk)
            if keep is not None and len(got) == keep:
                break
    client.close()
    return got, ep, paths


async def read_async(
    events: list[bytes], name: str, *, sessions: bool, keep: int | None
) -> tuple[list[bytes], tito.Episode, list[str]]:
    collector, transport, paths = collector_and_handler(events, asynchronous=True)
    client = collector.http_client(["vllm.test:8000"], sessions=sessions, transport=transport)
    url, payload = request_of(name)
    got: list[bytes] = []
    async with collector.episode() as ep, client.stream("POST", url, json=payload) as r:
        async for chunk in r.aiter_raw():
            got.append(chunk)
            if keep is not None and len(got) == keep:
                break
    await client.aclose()
    return got, ep, paths


@pytest.mark.parametrize("early", [False, True], ids=["read-to-end", "closed-early"])
@pytest.mark.parametrize("fault", CHAT_STREAM_FAULTS)
async def test_an_odd_chat_stream_reaches_the_caller_and_the_call_is_unusable(
    fault: str, early: bool
) -> None:
    edit, sessions = CHAT_STREAM_FAULTS[fault]
    events = chat_events(edit)
    keep = len(events) - 1 if early else None  # closed before [DONE], every odd chunk read
    expected = events[:keep]
    got, ep, paths = read_sync(events, "chat_stream", sessions=sessions, keep=keep)
    assert got == expected
    check_unusable(ep, paths)
    got, ep, paths = await read_async(events, "chat_stream", sessions=sessions, keep=keep)
    assert got == expected
    check_unusable(ep, paths)


@pytest.mark.parametrize("early", [False, True], ids=["read-to-end", "closed-early"])
@pytest.mark.parametrize("fault", RESPONSES_FAULTS)
async def test_an_odd_responses_final_event_reaches_the_caller_and_the_call_is_unusable(
    fault: str, early: bool
) -> None:
    events = responses_events(RESPONSES_FAULTS[fault])
    keep = len(events) if early else None  # the caller stops at the final event and closes
    got, ep, paths = read_sync(events, "real/responses_stream", sessions=False, keep=keep)
    assert got == events
    check_unusable(ep, paths)
    got, ep, paths = await read_async(events, "real/responses_stream", sessions=False, keep=keep)
    assert got == events
    check_unusable(ep, paths)


def sdk_chunks(client: Any) -> list[dict[str, Any]]:
    stream = client.chat.completions.create(model="tiny", messages=MSG, stream=True)
    return [chunk.model_dump(warnings=False) for chunk in stream]


async def async_sdk_chunks(client: Any) -> list[dict[str, Any]]:
    stream = await client.chat.completions.create(model="tiny", messages=MSG, stream=True)
    return [chunk.model_dump(warnings=False) async for chunk in stream]


@pytest.mark.parametrize("fault", CHAT_STREAM_FAULTS)
async def test_the_openai_sdk_reads_an_odd_stream_as_it_would_without_capture(fault: str) -> None:
    """What the reviewer saw: the unwrapped openai client returns every chunk; wrapped, the
    same chunks and no exception, sync and async."""
    edit, sessions = CHAT_STREAM_FAULTS[fault]
    events = chat_events(edit)
    for asynchronous in (False, True):
        cls = openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient
        make = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        results = []
        for wrapped in (False, True):
            collector, transport, paths = collector_and_handler(events, asynchronous=asynchronous)
            client = make(
                base_url=BASE_URL, api_key="sk-test", http_client=cls(transport=transport)
            )
            if wrapped:
                collector.wrap(client, sessions=sessions)
            with collector.episode() as ep:
                if asynchronous:
                    results.append(await async_sdk_chunks(client))
                else:
                    results.append(sdk_chunks(client))
            if wrapped:
                check_unusable(ep, paths)
        assert results[0] == results[1]
        assert len(results[0]) == len(events) - 1  # every chunk but [DONE]


def chat_body(edit: Edit) -> bytes:
    body = load_capture("chat_ns").json()
    edit(body)
    return json.dumps(body).encode()


def responses_body(edit: Edit) -> bytes:
    body = load_capture("real/responses_ns").json()
    edit(body)
    return json.dumps(body).encode()


def second_choice(index: Any) -> Edit:
    return lambda b: b["choices"].append({**b["choices"][0], "index": index})


BODY_FAULTS: dict[str, tuple[str, bytes]] = {
    "choices-a-string": ("chat_ns", chat_body(lambda b: b.__setitem__("choices", "abc"))),
    "choices-hold-an-int": ("chat_ns", chat_body(lambda b: b.__setitem__("choices", [1]))),
    "index-a-list": ("chat_ns", chat_body(lambda b: b["choices"][0].__setitem__("index", [1]))),
    "index-0-then-a-string": ("chat_ns", chat_body(second_choice("a"))),
    "content-an-int": ("real/responses_ns", responses_body(message_content(5))),
    "summary-an-int": ("real/responses_ns", responses_body(reasoning_summary(5))),
    "output-item-an-int": ("real/responses_ns", responses_body(lambda r: r["output"].append(5))),
}


@pytest.mark.parametrize("fault", BODY_FAULTS)
async def test_an_odd_body_reaches_the_caller_and_the_call_is_unusable(fault: str) -> None:
    name, body = BODY_FAULTS[fault]
    url, payload = request_of(name)
    payload["stream"] = False
    for asynchronous in (False, True):
        collector, transport, paths = collector_and_handler(body, asynchronous=asynchronous)
        client = collector.http_client(
            ["vllm.test:8000"], asynchronous=asynchronous, transport=transport
        )
        if asynchronous:
            async with collector.episode() as ep:
                response = await client.post(url, json=payload)
            await client.aclose()
        else:
            with collector.episode() as ep:
                response = client.post(url, json=payload)
            client.close()
        assert response.content == body
        check_unusable(ep, paths)


def test_odd_tool_call_arguments_in_a_session_body_never_break_the_call() -> None:
    """Sessions on, a body whose tool call arguments are no string: the caller gets the body as
    sent, and nothing is left in flight (the message is the server's own; the call is kept)."""
    body = chat_body(
        lambda b: b["choices"][0]["message"].__setitem__("tool_calls", tool_call(0, 5))
    )
    url, payload = request_of("chat_ns")
    collector, transport, paths = collector_and_handler(body, asynchronous=False)
    client = collector.http_client(
        ["vllm.test:8000"], asynchronous=False, sessions=True, transport=transport
    )
    with collector.episode() as ep:
        response = client.post(url, json=payload)
    client.close()
    assert response.content == body
    assert len(paths) == 1 and len(ep.calls) == 1 and ep.inflight == 0


@pytest.mark.parametrize("where", ["feed_event", "finish_stream"])
@pytest.mark.parametrize("early", [False, True], ids=["read-to-end", "closed-early"])
async def test_a_parser_fault_of_any_type_never_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch, where: str, early: bool
) -> None:
    """Whatever a parser raises (here a bug's RuntimeError), the tee records the call unusable
    once and the caller's stream goes on: at a chunk, at the end, at an early close."""

    def boom(*args: Any) -> Any:
        raise RuntimeError("a parser bug")

    monkeypatch.setattr(ChoicesParser, where, boom)
    events = chat_events(lambda cs: None)
    keep = len(events) - 1 if early else None
    sync = read_sync(events, "chat_stream", sessions=False, keep=keep)
    asyn = await read_async(events, "chat_stream", sessions=False, keep=keep)
    for got, ep, paths in (sync, asyn):
        assert got == events[:keep]
        check_unusable(ep, paths)
        assert "unreadable stream (RuntimeError('a parser bug'))" in str(ep.calls[0].error)
