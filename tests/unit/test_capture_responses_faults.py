"""Responses API streams and bodies under bad conditions: every split and line end of a real
stream, readers that stop at `response.completed`, abandoned and cut streams, error events,
malformed and inconsistent bodies, older servers (through the fake vLLM's fault switches).

A Responses stream carries the ids only in its final `response.completed` event and ends without
`[DONE]`: the call is complete when that event arrived, whatever the framing or the reader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder as SdkDecoder

import tito_agents as tito
from tests.support.capture_replay import (
    BASE_URL,
    REAL_VLLM,
    Capture,
    Replay,
    load_capture,
    replay_clients,
)
from tito_agents import errors
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, Faults, mock_transport

ENDINGS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}
URL = BASE_URL + "/responses"


def capture(name: str) -> Capture:
    where, _, base = name.partition("/")
    return load_capture(base, REAL_VLLM) if where == "real" else load_capture(base)


def framed(name: str, ending: str) -> bytes:
    """The stream with `ending` after every line (`event:` and `data:`) and a blank line after
    every event."""
    end = ENDINGS[ending]
    events = [e.split(b"\n") for e in capture(name).body.split(b"\n\n") if e.strip()]
    return b"".join(b"".join(line + end for line in lines) + end for lines in events)


def summary(call: tito.Call) -> tuple[Any, ...]:
    return (
        call.status,
        call.call_id,
        call.prompt_ids.tolist(),
        call.sampled_ids.tolist(),
        None if call.logprobs is None else call.logprobs.tolist(),
        call.finish_reason,
        call.tool_calls,
        type(call.error),
    )


def sse_response(chunks: list[bytes], *, asynchronous: bool) -> httpx2.Response:
    headers = {"content-type": "text/event-stream"}
    if asynchronous:

        async def agen() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return httpx2.Response(200, headers=headers, content=agen())
    return httpx2.Response(200, headers=headers, content=iter(chunks))


def payload_of(name: str) -> dict[str, Any]:
    return {k: v for k, v in capture(name).request.items() if k != "enable_response_messages"}


def run_sync(name: str, chunk_lists: Iterator[list[bytes]], reader: str) -> list[list[Any]]:
    """The recorded calls of one request per chunk list. Readers: "sdk" (events, stops at
    `response.completed`), "lines" (stops at that event's data line, before its blank line),
    "all" (reads to the end)."""
    holder: dict[str, list[bytes]] = {}
    collector = tito.Collector(capture_logprobs=False, errors="count")
    transport = httpx2.MockTransport(lambda r: sse_response(holder["next"], asynchronous=False))
    client = collector.http_client(["vllm.test:8000"], asynchronous=False, transport=transport)
    out = []
    for chunks in chunk_lists:
        holder["next"] = chunks
        with collector.episode() as ep, client.stream("POST", URL, json=payload_of(name)) as r:
            if reader == "sdk":
                for event in SdkDecoder().iter_bytes(r.iter_bytes()):
                    if event.event == "response.completed":
                        break
            elif reader == "lines":
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"type":"response.completed"' in line:
                        break
            else:
                r.read()
        out.append([summary(c) for c in ep.calls])
    client.close()
    return out


async def run_async(name: str, chunk_lists: Iterator[list[bytes]], reader: str) -> list[list[Any]]:
    holder: dict[str, list[bytes]] = {}
    collector = tito.Collector(capture_logprobs=False, errors="count")

    async def handler(request: httpx2.Request) -> httpx2.Response:
        return sse_response(holder["next"], asynchronous=True)

    client = collector.http_client(["vllm.test:8000"], transport=httpx2.MockTransport(handler))
    out = []
    for chunks in chunk_lists:
        holder["next"] = chunks
        async with (
            collector.episode() as ep,
            client.stream("POST", URL, json=payload_of(name)) as r,
        ):
            if reader == "sdk":
                async for event in SdkDecoder().aiter_bytes(r.aiter_bytes()):
                    if event.event == "response.completed":
                        break
            else:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and '"type":"response.completed"' in line:
                        break
        out.append([summary(c) for c in ep.calls])
    await client.aclose()
    return out


def unsplit(name: str) -> list[Any]:
    (calls,) = run_sync(name, iter([[framed(name, "lf")]]), "all")
    assert [c[0] for c in calls] == [tito.CallStatus.COMPLETE]
    return calls


@pytest.mark.parametrize("reader", ["sdk", "lines"])
@pytest.mark.parametrize("ending", ENDINGS)
async def test_every_split_of_a_responses_stream_records_the_same_call(
    ending: str, reader: str
) -> None:
    """A real Responses stream (vLLM 0.32, tests/data/captures) split once at every byte, read
    line by line (sync transport) or event by event (async) to `response.completed` and closed
    there (its blank line unread): the same complete call each time."""
    name = "tiny/responses_stream"
    want = unsplit(name)
    data = framed(name, ending)

    def splits() -> Iterator[list[bytes]]:
        return ([data[:cut], data[cut:]] for cut in range(1, len(data)))

    # one transport per reader (the flow is shared; the tee is the same object for both)
    if reader == "lines":
        for cut, calls in enumerate(run_sync(name, splits(), reader), start=1):
            assert calls == want, f"sync, split at {cut}"
    else:
        for cut, calls in enumerate(await run_async(name, splits(), reader), start=1):
            assert calls == want, f"async, split at {cut}"


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["real/responses_stream", "real/responses_tool_required_stream"]),
    ending=st.sampled_from(list(ENDINGS)),
    reader=st.sampled_from(["sdk", "lines", "all"]),
    cuts=st.lists(st.integers(0, 12_000), min_size=1, max_size=30),
)
def test_any_splits_of_real_responses_streams_record_the_same_call(
    name: str, ending: str, reader: str, cuts: list[int]
) -> None:
    """SmolLM2 streams (text with logprobs, a streamed function call), many splits at once."""
    data = framed(name, ending)
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    (calls,) = run_sync(name, iter([chunks]), reader)
    assert calls == unsplit(name)


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_stream_cut_before_its_final_event_is_incomplete(ending: str) -> None:
    """Everything up to `response.completed`, without it: the call is incomplete, never a
    sample, whether the stream ends cleanly there or the caller closes it."""
    name = "real/responses_stream"
    data = framed(name, ending)
    cut = data.index(b"event: response.completed")
    for reader in ("all", "sdk"):
        (calls,) = run_sync(name, iter([[data[:cut]]]), reader)
        assert [c[0] for c in calls] == [tito.CallStatus.INCOMPLETE]
        assert calls[0][-1] is errors.IncompleteCallError


def test_an_error_event_makes_the_call_unusable() -> None:
    """vLLM sends `error` events for failures inside a stream: a typed error, no sample."""
    data = framed("real/responses_stream", "lf")
    cut = data.index(b"event: response.output_item.added")
    error = (
        b'event: error\ndata: {"type":"error","code":"500","message":"engine died",'
        b'"param":null,"sequence_number":2}\n\n'
    )
    (calls,) = run_sync("real/responses_stream", iter([[data[:cut] + error]]), "all")
    assert [c[0] for c in calls] == [tito.CallStatus.UNUSABLE]
    assert calls[0][-1] is errors.MalformedResponseError


# ---- bodies ------------------------------------------------------------------------------------


def edited(name: str, edit: Any) -> Capture:
    cap = capture(name)
    body = cap.json()
    edit(body)
    return Capture(
        cap.name + "-edited", cap.path, cap.request, cap.status, json.dumps(body).encode()
    )


def one_call(cap: Capture, **kwargs: Any) -> tito.Call:
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(errors="count", **kwargs)
    collector.wrap(client)
    with collector.episode() as ep:
        client.responses.create(model="m", input="x")
    (call,) = ep.calls
    return call


def _drop_last_output_id(b: dict[str, Any]) -> None:
    b["output_messages"][0]["tokens"].pop()


def _drop_a_logprob(b: dict[str, Any]) -> None:
    b["output"][0]["content"][0]["logprobs"].pop()


def _two_turns(b: dict[str, Any]) -> None:
    b["output_messages"].append(b["output_messages"][0])


def _float_ids(b: dict[str, Any]) -> None:
    b["input_messages"][0]["tokens"][0] = 1.0


def _harmony(b: dict[str, Any]) -> None:
    b["input_messages"] = [{"role": "user", "content": "x"}]


def _not_a_response(b: dict[str, Any]) -> None:
    b["object"] = "chat.completion"


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (_drop_last_output_id, errors.TokenCountMismatchError),
        (_drop_a_logprob, errors.TokenCountMismatchError),
        (_two_turns, errors.MalformedResponseError),
        (_float_ids, errors.MalformedResponseError),
        (_harmony, errors.MissingTokenIdsError),
        (_not_a_response, errors.MalformedResponseError),
    ],
    ids=["usage", "logprobs", "two-turns", "float-ids", "harmony", "not-a-response"],
)
def test_inconsistent_responses_bodies_are_typed_errors(edit: Any, error: type[Exception]) -> None:
    """Ids that disagree with usage, logprobs that do not cover the text's ids, several engine
    turns, non-integer ids, harmony messages without tokens: unusable, with the typed error."""
    call = one_call(edited("real/responses_ns", edit), capture_logprobs=True)
    assert call.status is tito.CallStatus.UNUSABLE
    assert type(call.error) is error


def test_a_malformed_body_is_recorded_and_handed_on() -> None:
    cap = capture("real/responses_ns")
    broken = Capture("broken", cap.path, cap.request, 200, cap.body[: len(cap.body) // 2])
    client, _ = replay_clients(Replay([broken]))
    collector = tito.Collector(errors="count")
    collector.wrap(client)
    with collector.episode() as ep, pytest.raises(Exception):  # noqa: B017 the SDK's own parse error
        client.responses.create(model="m", input="x")
    assert ep.calls[0].status is tito.CallStatus.UNUSABLE
    assert isinstance(ep.calls[0].error, errors.MalformedResponseError)


# ---- against the fake vLLM's fault switches ----------------------------------------------------


def fake_client(**faults: Any) -> tuple[openai.OpenAI, tito.Collector]:
    fake = FakeVLLM(FakeConfig(faults=Faults(**faults)))
    client = openai.OpenAI(
        base_url=BASE_URL,
        api_key="x",
        max_retries=3,
        http_client=openai.DefaultHttpxClient(transport=mock_transport(fake)),
    )
    collector = tito.Collector(errors="count")
    collector.wrap(client)
    return client, collector


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("no_token_ids", errors.MissingTokenIdsError),
        ("length_mismatch", errors.TokenCountMismatchError),
    ],
)
def test_old_or_inconsistent_servers_give_typed_errors(
    fault: str, error: type[Exception], stream: bool
) -> None:
    """A server that ignores enable_response_messages (vLLM < 0.32, non-harmony models) or whose
    ids disagree with its usage: the caller's call works, the call is unusable with the typed
    error (MissingTokenIdsError names the fix)."""
    client, collector = fake_client(**{fault: True})
    with collector.episode() as ep:
        if stream:
            with client.responses.stream(model="SmolLM2-135M-Instruct", input="Hi") as events:
                text = events.get_final_response().output_text
        else:
            text = client.responses.create(model="SmolLM2-135M-Instruct", input="Hi").output_text
    assert text
    (call,) = ep.calls
    assert call.status is tito.CallStatus.UNUSABLE and type(call.error) is error
    if error is errors.MissingTokenIdsError:
        assert "vLLM >= 0.32" in (call.error.fix or "")


def test_cut_stream_is_incomplete_and_retries_yield_one_call() -> None:
    """A stream cut mid-way is an incomplete call (the SDK sees the broken body); 503s before a
    body are failed attempts the SDK retries, then one complete call."""
    client, collector = fake_client(cut_stream_after=4)
    with (
        collector.episode() as ep,
        pytest.raises(Exception),  # noqa: B017 httpx's read error
        client.responses.stream(model="SmolLM2-135M-Instruct", input="Hi") as events,
    ):
        for _ in events:
            pass
    assert [c.status for c in ep.calls] == [tito.CallStatus.INCOMPLETE]
    client, collector = fake_client(status_before_body=503, status_before_body_count=2)
    with collector.episode() as ep:
        client.responses.create(model="SmolLM2-135M-Instruct", input="Hi")
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE]
    assert collector.stats.failed_attempts == 2


def test_malformed_sse_from_the_fake_is_recorded_not_raised() -> None:
    """An event framed wrongly (no colon, no blank line) joins the next one: the stream still
    completes for the SDK or fails its parse; capture records a call either way, never raises."""
    client, collector = fake_client(malformed_json=True)
    with (
        collector.episode() as ep,
        pytest.raises(Exception),  # noqa: B017 the SDK's JSON error
        client.responses.stream(model="SmolLM2-135M-Instruct", input="Hi") as events,
    ):
        for _ in events:
            pass
    assert len(ep.calls) == 1 and ep.calls[0].status is not tito.CallStatus.COMPLETE
