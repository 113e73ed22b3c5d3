"""SSE framing: a stream's recorded call does not depend on its line ends or on how it is split.

The WHATWG event-stream rules: lines end with LF, CRLF or a bare CR, and a CR that ends one read
with its LF starting the next is one line end. Real vLLM 0.32 streams (tests/data/real_vllm:
SmolLM2; tests/data/captures: a tiny model, short streams) are re-framed with each kind of line
end and split at every byte, then driven through the sync and async capture transports and read
the way callers read them: event by event as the openai SDK does, or line by line, closing the
response at `[DONE]` without reading what follows (with CRLF, the LF after the last CR may still
be unread; with a line reader, the blank line after `data: [DONE]`). Every split must give the
call the unsplit stream gives, complete.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder as SdkDecoder

import tito_agents as tito
from tests.support.capture_replay import BASE_URL, REAL_VLLM, Capture, load_capture
from tito_agents._capture.wire import SSEDecoder

ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
STREAMS = [
    "real/chat_stream",
    "real/chat_stream_n2",
    "real/tool_required_stream",
    "tiny/cmpl_stream",
]
"""SmolLM2 streams (one choice, two, a forced tool call) and a completions stream."""
READERS = ["sdk", "lines"]
ChunkLists = Callable[[], Iterator[list[bytes]]]


def capture(name: str) -> Capture:
    """`real/<name>` from tests/data/real_vllm, `tiny/<name>` from tests/data/captures."""
    where, _, base = name.partition("/")
    return load_capture(base, REAL_VLLM) if where == "real" else load_capture(base)


def events_of(name: str) -> list[list[bytes]]:
    """The events of a stream capture, each as its lines (LF-framed on the wire)."""
    return [e.split(b"\n") for e in capture(name).body.split(b"\n\n") if e.strip()]


def framed(name: str, ending: str, *, extras: bool = False) -> bytes:
    """The stream with `ending` after every line and a blank line after every event; `extras`
    adds what a proxy may add: a BOM, comments, `event:`/`id:` lines, a payload over two lines."""
    end = ENDINGS[ending]
    out = []
    for i, lines in enumerate(events_of(name)):
        if extras and i == 1:
            out.append(b": keep-alive" + end + end)
            lines = [b"event: message", b"id: 7", *lines]
        if extras and i == 2:  # data over two lines joins with LF: the same JSON
            (line,) = lines
            cut = line.index(b'"object"')
            lines = [line[:cut], b"data:" + line[cut:]]
        out.append(b"".join(line + end for line in lines) + end)
    return (b"\xef\xbb\xbf" if extras else b"") + b"".join(out)


def parsed(payload: bytes) -> Any:
    """A payload as JSON (a payload over two data lines holds an LF between JSON tokens)."""
    return payload if payload == b"[DONE]" else json.loads(payload)


def want_payloads(name: str) -> list[Any]:
    return [parsed(lines[0][6:]) for lines in events_of(name)]


def decode(chunks: list[bytes]) -> list[bytes]:
    decoder, got = SSEDecoder(), []
    for chunk in chunks:
        got += decoder.feed(chunk)
    return got + decoder.flush()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# ---- the decoder alone -------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("name", ["real/chat_stream_n2", "tiny/cmpl_stream"])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "extras"])
def test_decoder_gives_the_same_events_for_every_split(
    name: str, ending: str, extras: bool
) -> None:
    """A stream split once at every byte gives the events of the unsplit stream."""
    data = framed(name, ending, extras=extras)
    whole = decode([data])
    assert [parsed(p) for p in whole] == want_payloads(name)
    for cut in range(1, len(data)):
        assert decode([data[:cut], data[cut:]]) == whole, cut


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(STREAMS),
    ending=st.sampled_from(list(ENDINGS)),
    extras=st.booleans(),
    cuts=st.lists(st.integers(0, 12_000), max_size=40),
)
def test_decoder_gives_the_same_events_for_any_splits(
    name: str, ending: str, extras: bool, cuts: list[int]
) -> None:
    """Many splits at once, empty reads included."""
    data = framed(name, ending, extras=extras)
    assert [parsed(p) for p in decode(split_at(data, cuts))] == want_payloads(name)


@pytest.mark.parametrize("ending", ENDINGS)
def test_decoder_completes_an_event_at_its_line_end(ending: str) -> None:
    """An event is handed on as soon as the line end that ends it arrives: at a bare CR, before
    the LF that may follow in the next read, which is then not a second line end."""
    end = ENDINGS[ending]
    decoder = SSEDecoder()
    data = b"data: [DONE]" + end + end
    if ending == "crlf":  # "...\r\n\r": the last CR already ends the blank line
        assert decoder.feed(data[:-1]) == [b"[DONE]"]
        assert decoder.feed(b"") == []
        assert decoder.feed(data[-1:]) == []
    else:
        assert decoder.feed(data[:-1]) == []
        assert decoder.feed(data[-1:]) == [b"[DONE]"]
    assert decoder.feed(b"data: 1" + end + end) == [b"1"]
    assert decoder.flush() == []


def test_decoder_reads_fields_as_the_spec_says() -> None:
    """Comments, other fields, `data` without a colon or a space, several data lines."""
    stream = b": c\n\nevent: x\ndata:a\ndata\ndata: b\nid: 1\n\nretry: 5\n\ndata:  two\n\n"
    assert decode([stream]) == [b"a\n\nb", b" two"]


def test_decoder_flushes_complete_lines_only_when_asked() -> None:
    """At the end of the body the last line counts without its line end; when the caller closes
    early, only lines whose end arrived count."""
    end = SSEDecoder()
    assert end.feed(b"data: 1\n\ndata: [DONE]") == [b"1"]
    assert end.flush() == [b"[DONE]"]
    closed = SSEDecoder()
    assert closed.feed(b"data: [DONE]\ndata: x") == []
    assert closed.flush(complete_lines=True) == [b"[DONE]"]
    cut = SSEDecoder()
    assert cut.feed(b'data: {"a"') == []
    assert cut.flush(complete_lines=True) == []


# ---- through the transports --------------------------------------------------------------------


def sse_response(chunks: list[bytes], *, asynchronous: bool) -> httpx2.Response:
    headers = {"content-type": "text/event-stream"}
    if asynchronous:

        async def agen() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return httpx2.Response(200, headers=headers, content=agen())
    return httpx2.Response(200, headers=headers, content=iter(chunks))


class Server:
    """Answers each request with the chunks of `next`."""

    def __init__(self) -> None:
        self.next: list[bytes] = []

    def sync(self, request: httpx2.Request) -> httpx2.Response:
        return sse_response(self.next, asynchronous=False)

    async def asynchronous(self, request: httpx2.Request) -> httpx2.Response:
        return sse_response(self.next, asynchronous=True)


def request_of(name: str) -> tuple[str, dict[str, Any]]:
    """The URL and JSON a caller sends for this capture (without the field capture adds)."""
    cap = capture(name)
    url = BASE_URL + cap.path.removeprefix("/v1")
    return url, {k: v for k, v in cap.request.items() if k != "return_token_ids"}


def summary(call: tito.Call) -> tuple[Any, ...]:
    """Everything a call records from the response."""
    return (
        call.status,
        call.call_id,
        call.model,
        call.prompt_ids.tolist(),
        call.sampled_ids.tolist(),
        None if call.logprobs is None else call.logprobs.tolist(),
        call.finish_reason,
        call.stop_reason,
        type(call.error),
    )


def run_sync(name: str, chunk_lists: ChunkLists, reader: str) -> list[list[Any]]:
    """The recorded calls of one request per chunk list, on the sync transport. The reader
    stops at `[DONE]` and closes: as the openai SDK (events), or at the line `data: [DONE]`; or
    after its first read ("first-read")."""
    server = Server()
    collector = tito.Collector(capture_logprobs=False, errors="count")
    client = collector.http_client(
        ["vllm.test:8000"], asynchronous=False, transport=httpx2.MockTransport(server.sync)
    )
    url, payload = request_of(name)
    out = []
    for chunks in chunk_lists():
        server.next = chunks
        with collector.episode() as ep, client.stream("POST", url, json=payload) as response:
            if reader == "sdk":
                for event in SdkDecoder().iter_bytes(response.iter_bytes()):
                    if event.data.startswith("[DONE]"):
                        break
            elif reader == "first-read":
                next(response.iter_bytes())
            else:
                for line in response.iter_lines():
                    if line == "data: [DONE]":
                        break
        out.append([summary(c) for c in ep.calls])
    client.close()
    return out


async def run_async(name: str, chunk_lists: ChunkLists, reader: str) -> list[list[Any]]:
    """The async twin of `run_sync`."""
    server = Server()
    collector = tito.Collector(capture_logprobs=False, errors="count")
    client = collector.http_client(
        ["vllm.test:8000"], transport=httpx2.MockTransport(server.asynchronous)
    )
    url, payload = request_of(name)
    out = []
    for chunks in chunk_lists():
        server.next = chunks
        async with collector.episode() as ep, client.stream("POST", url, json=payload) as response:
            if reader == "sdk":
                async for event in SdkDecoder().aiter_bytes(response.aiter_bytes()):
                    if event.data.startswith("[DONE]"):
                        break
            else:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        break
        out.append([summary(c) for c in ep.calls])
    await client.aclose()
    return out


def unsplit(name: str) -> list[Any]:
    """The calls of the stream as vLLM sends it (LF, one read)."""
    (calls,) = run_sync(name, lambda: iter([[framed(name, "lf")]]), "sdk")
    assert calls and all(c[0] is tito.CallStatus.COMPLETE for c in calls)
    return calls


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("ending", ENDINGS)
async def test_every_split_through_the_transports_records_the_same_call(
    ending: str, reader: str
) -> None:
    """Sync and async, a real (short) stream split at every byte: the same complete call each
    time, also when the reader closes at `[DONE]` with the last line end(s) unread."""
    name = "tiny/chat_stream"
    want = unsplit(name)
    data = framed(name, ending)

    def splits() -> Iterator[list[bytes]]:
        return ([data[:cut], data[cut:]] for cut in range(1, len(data)))

    for cut, calls in enumerate(run_sync(name, splits, reader), start=1):
        assert calls == want, f"sync, split at {cut}"
    for cut, calls in enumerate(await run_async(name, splits, reader), start=1):
        assert calls == want, f"async, split at {cut}"


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(STREAMS),
    ending=st.sampled_from(list(ENDINGS)),
    reader=st.sampled_from(READERS),
    cuts=st.lists(st.integers(0, 12_000), min_size=1, max_size=30),
)
def test_any_splits_through_the_transport_record_the_same_calls(
    name: str, ending: str, reader: str, cuts: list[int]
) -> None:
    """Longer real streams (n=2, a streamed tool call, completions), many splits at once, with
    a BOM, comments, other fields and a payload over two lines."""
    chunks = split_at(framed(name, ending, extras=True), cuts)
    (calls,) = run_sync(name, lambda: iter([chunks]), reader)
    assert calls == unsplit(name)


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_stream_closed_before_done_stays_incomplete(ending: str) -> None:
    """Reading what arrived to its last complete line on close does not make an abandoned stream
    complete: everything up to `[DONE]`, without it, is still incomplete."""
    name = "real/chat_stream"
    data = framed(name, ending)
    cut = data.index(b"data: [DONE]")
    (calls,) = run_sync(name, lambda: iter([[data[:cut], data[cut:]]]), "first-read")
    assert [c[0] for c in calls] == [tito.CallStatus.INCOMPLETE]
    assert calls[0][-1] is tito.errors.IncompleteCallError
