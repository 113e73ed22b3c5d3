"""The caller's copy of an answer is the server's bytes: only what capture added is set back.

A server echoes what the caller wrote (a Responses answer repeats the request's `tools`) and
writes its own JSON as it likes. Had capture parsed the answer and serialised it again, an integer
beyond 64 bits would reach the caller as a float, and floats, escapes, whitespace and key order
would be respelled. Each test sends the same request through an unwrapped and a wrapped client and
compares the body bytes. The "server" is the fake vLLM behind a handler that echoes a raw JSON
value byte for byte: the fake holds a placeholder where the caller wrote the value (it parses and
dumps JSON itself), and the handler puts the caller's bytes back in its answer. The handler also
fixes the answer's ids and times, which differ on every call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeResponse, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

PLACE = b'"@@caller-value@@"'
"""What the fake sees where the caller wrote the value under test."""


def framed(raw: bytes) -> bytes:
    """`raw` between two strings no test value holds, so the handler finds it in a request."""
    return b'["@@from@@",' + raw + b',"@@to@@"]'


_VARYING = re.compile(rb'"(id|created|created_at)":("[^"]*"|\d+)')

VALUES = {
    "big-int": b"123456789012345678901234567890",
    "big-negative": b"-123456789012345678901234567890",
    "float-1.0": b"1.0",
    "exponent": b"1e5",
    "negative-zero": b"-0.0",
    "capital-exponent": b"2.5E+3",
    "unicode-escape": b'"caf\\u00e9"',
    "escaped-slash": b'"a\\/b"',
    "spaced-object": b'{ "z" : [ 1 , 2.50 ] ,\n "a":{"y":1E2} }',
}


def server(fake: FakeVLLM, raw: bytes) -> Any:
    """A handler: the fake, fed `PLACE` for the caller's `raw` value, answering it back as `raw`."""

    value = framed(raw)

    def handle(method: str, target: str, body: bytes, headers: Mapping[str, str]) -> FakeResponse:
        assert body.count(value) == 1, "the caller's value did not reach the server as written"
        reply = fake.handle(method, target, body.replace(value, PLACE), headers)
        if reply.stream is not None:
            return dataclasses.replace(reply, stream=_echoed(reply.stream, value))
        answer = _VARYING.sub(rb'"\1":"fixed"', reply.body.replace(PLACE, value))
        return dataclasses.replace(reply, body=answer)

    return handle


async def _echoed(stream: AsyncIterator[bytes], value: bytes) -> AsyncIterator[bytes]:
    async for event in stream:  # one event per chunk: the placeholder is never split
        yield event.replace(PLACE, value)


@pytest.fixture(scope="module")
def fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=lambda view: "It is sunny in Paris."))


def request(endpoint: str, raw: bytes, long: bool) -> bytes:
    """A request with `raw` where the server echoes it back (`tools` of a Responses request) or,
    for chat and completions, which echo nothing of a request, in a `metadata` field."""
    text = "Weather in Paris? " * (300 if long else 1)
    if endpoint == "responses":
        tool = (
            b'{"type":"function","name":"lookup","parameters":{"type":"object","properties":'
            b'{"n":{"type":"integer","maximum":' + framed(raw) + b"}}}}"
        )
        return (
            b'{"model":' + orjson.dumps(MODEL_NAME) + b',"input":' + orjson.dumps(text)
            + b',"max_output_tokens":16,"temperature":0,"tools":[' + tool + b"]}"
        )  # fmt: skip
    prompt = (
        b'"messages":[{"role":"user","content":' + orjson.dumps(text) + b"}]"
        if endpoint == "chat/completions"
        else b'"prompt":' + orjson.dumps(text)
    )
    return (
        b'{"model":' + orjson.dumps(MODEL_NAME) + b"," + prompt
        + b',"max_tokens":16,"temperature":0,"metadata":' + framed(raw) + b"}"
    )  # fmt: skip


def echoing_server(fake: FakeVLLM, raw: bytes) -> Any:
    """`server`, where a chat or completions answer also carries the caller's `metadata` value
    (as a server's own field would be: capture must hand it on as written)."""
    inner = server(fake, raw)

    def handle(method: str, target: str, body: bytes, headers: Mapping[str, str]) -> FakeResponse:
        reply = inner(method, target, body, headers)
        if target.endswith("/responses"):
            return reply
        return dataclasses.replace(
            reply, body=b'{"metadata":' + framed(raw) + b"," + reply.body[1:]
        )

    return handle


def both(
    fake: FakeVLLM, endpoint: str, raw: bytes, *, long: bool, logprobs: bool
) -> tuple[bytes, bytes]:
    """The answer body an unwrapped and a wrapped client get for the same request."""
    body = request(endpoint, raw, long)
    handler = echoing_server(fake, raw)
    url = f"http://vllm.test/v1/{endpoint}"
    headers = {"content-type": "application/json"}
    with openai.DefaultHttpxClient(transport=mock_transport(handler)) as plain:
        want = plain.post(url, content=body, headers=headers)
    collector = tito.Collector(capture_logprobs=logprobs)
    wrapped = collector.http_client(
        ["vllm.test"], asynchronous=False, transport=mock_transport(handler)
    )
    with wrapped, collector.episode() as ep:
        got = wrapped.post(url, content=body, headers=headers)
    assert want.status_code == got.status_code == 200, got.text
    # a value beyond what a double holds (1E400) is no strict JSON: capture sends such a
    # request as written, uncaptured
    captured = [tito.CallStatus.COMPLETE] if _strict_json(raw) else []
    assert [call.status for call in ep.calls] == captured
    return want.content, got.content


def _strict_json(raw: bytes) -> bool:
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return True


@pytest.mark.parametrize("logprobs", [False, True], ids=["ids", "ids+logprobs"])
@pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
@pytest.mark.parametrize("endpoint", ["chat/completions", "completions", "responses"])
@pytest.mark.parametrize("raw", list(VALUES.values()), ids=list(VALUES))
def test_the_caller_gets_the_servers_bytes(
    fake: FakeVLLM, raw: bytes, endpoint: str, long: bool, logprobs: bool
) -> None:
    want, got = both(fake, endpoint, raw, long=long, logprobs=logprobs)
    assert framed(raw) in want
    assert got == want


def _spaced(items: list[bytes], open_: bytes, close: bytes, space: bytes) -> bytes:
    return open_ + space + (space + b"," + space).join(items) + space + close


_SPACE = st.sampled_from([b"", b" ", b"\n  ", b"\t"])
_NUMBER = st.one_of(
    st.integers(-(2**100), 2**100).map(lambda n: str(n).encode()),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
    st.sampled_from([b"1.0", b"1e5", b"-0.0", b"1E+2", b"0.50", b"-1.5e-7", b"1E400"]),
)
_STRING = st.one_of(
    st.text(max_size=8).map(lambda s: orjson.dumps(s)),
    st.sampled_from([b'"\\u00e9"', b'"\\/"', b'"\\ud83d\\ude00"', b'"tab\\tx"']),
)
_SCALAR = st.one_of(_NUMBER, _STRING, st.sampled_from([b"true", b"false", b"null"]))
JSON_TEXT = st.recursive(
    _SCALAR,
    lambda inner: st.one_of(
        st.builds(_spaced, st.lists(inner, max_size=4), st.just(b"["), st.just(b"]"), _SPACE),
        st.builds(
            _spaced,
            st.lists(
                st.tuples(_STRING, _SPACE, inner).map(lambda m: m[0] + m[1] + b":" + m[2]),
                max_size=4,
            ),
            st.just(b"{"),
            st.just(b"}"),
            _SPACE,
        ),
    ),
    max_leaves=12,
)
"""Raw JSON text: any value, spelled as a server or a caller may spell it."""


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    raw=JSON_TEXT,
    endpoint=st.sampled_from(["chat/completions", "responses"]),
    logprobs=st.booleans(),
)
def test_any_echoed_value_reaches_the_caller_as_the_server_wrote_it(
    fake: FakeVLLM, raw: bytes, endpoint: str, logprobs: bool
) -> None:
    want, got = both(fake, endpoint, raw, long=False, logprobs=logprobs)
    assert got == want


@pytest.mark.parametrize(
    "raw",
    [raw.replace(b"\n", b" ") for raw in VALUES.values()],  # an SSE data line holds no newline
    ids=list(VALUES),
)
def test_a_stream_reaches_the_caller_as_the_server_sent_it(fake: FakeVLLM, raw: bytes) -> None:
    """A Responses stream echoes the tools in its first and final events: the caller reads the
    server's bytes as they come (a stream is never rewritten: the added ids stay in it)."""
    body = request("responses", raw, long=False)[:-1] + b',"stream":true}'
    sent: list[bytes] = []
    handler = server(fake, raw)

    def recording(
        method: str, target: str, body: bytes, headers: Mapping[str, str]
    ) -> FakeResponse:
        reply = handler(method, target, body, headers)
        assert reply.stream is not None
        return dataclasses.replace(reply, stream=_recorded(reply.stream, sent))

    collector = tito.Collector(capture_logprobs=True)
    wrapped = collector.http_client(
        ["vllm.test"], asynchronous=False, transport=mock_transport(recording)
    )
    with wrapped, collector.episode() as ep:
        got = wrapped.post("http://vllm.test/v1/responses", content=body).content
    assert [call.status for call in ep.calls] == [tito.CallStatus.COMPLETE]
    assert got == b"".join(sent)
    assert got.count(framed(raw)) == 3  # response.created, .in_progress and .completed


async def _recorded(stream: AsyncIterator[bytes], sent: list[bytes]) -> AsyncIterator[bytes]:
    async for event in stream:
        sent.append(event)
        yield event
