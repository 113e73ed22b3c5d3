"""Wrapped vs unwrapped openai clients against the fake vLLM (which validates requests as vLLM
0.32 does): whatever odd field a caller sends, the wrapped client gets what the unwrapped one gets,
the same status and the same error or answer; sync, async and streaming, chat, completions and
Responses, token-in sessions included; and no call is ever left counted in flight."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeResponse, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME as MODEL

USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def fake() -> FakeVLLM:
    return FakeVLLM()


class Recorder:
    """The fake behind a transport that keeps each request body it receives."""

    def __init__(self, fake: FakeVLLM) -> None:
        self.fake = fake
        self.bodies: list[bytes] = []

    def __call__(
        self, method: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> FakeResponse:
        if not path.endswith("/tokenize"):
            self.bodies.append(body)
        return self.fake.handle(method, path, body, headers)


def clients(fake: FakeVLLM, *, is_async: bool) -> tuple[Any, Any, Recorder]:
    """(unwrapped client, client to wrap, the recorder behind the second)."""
    recorder = Recorder(fake)
    if is_async:
        make: Any = lambda t: openai.AsyncOpenAI(  # noqa: E731
            base_url="http://vllm.test/v1",
            api_key="x",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(transport=t),
        )
    else:
        make = lambda t: openai.OpenAI(  # noqa: E731
            base_url="http://vllm.test/v1",
            api_key="x",
            max_retries=0,
            http_client=openai.DefaultHttpxClient(transport=t),
        )
    return make(mock_transport(fake)), make(mock_transport(recorder)), recorder


def call(endpoint: str, extra: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The create(...) keyword arguments of one request."""
    args: dict[str, Any] = {"model": MODEL, "extra_body": extra}
    if endpoint == "chat":
        args["messages"] = USER
    elif endpoint == "completions":
        args["prompt"] = "Once upon a time"
    else:
        args["input"] = "Weather in Paris?"
    if stream:
        args["stream"] = True
    return args


def resource(client: Any, endpoint: str) -> Any:
    if endpoint == "chat":
        return client.chat.completions
    return client.completions if endpoint == "completions" else client.responses


def summary(endpoint: str, result: Any, stream: bool) -> Any:
    """What the caller sees, comparable across clients."""
    if stream:
        return [_chunk_text(endpoint, c) for c in result]
    if endpoint == "chat":
        return [(c.message.content, c.finish_reason) for c in result.choices]
    if endpoint == "completions":
        return [(c.text, c.finish_reason) for c in result.choices]
    return result.output_text


def _chunk_text(endpoint: str, chunk: Any) -> Any:
    if endpoint == "chat":
        return [(c.index, c.delta.content) for c in chunk.choices]
    if endpoint == "completions":
        return [(c.index, c.text) for c in chunk.choices]
    return (chunk.type, getattr(chunk, "delta", None))


def outcome(run: Any) -> tuple[Any, ...]:
    try:
        return ("ok", run())
    except openai.APIStatusError as exc:
        return (exc.status_code, json.dumps(exc.body, sort_keys=True))


async def aoutcome(run: Any) -> tuple[Any, ...]:
    try:
        return ("ok", await run())
    except openai.APIStatusError as exc:
        return (exc.status_code, json.dumps(exc.body, sort_keys=True))


def compare_sync(fake: FakeVLLM, endpoint: str, extra: dict[str, Any], stream: bool) -> Any:
    raw, wrapped, _ = clients(fake, is_async=False)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(wrapped)

    def run(client: Any) -> Any:
        result = resource(client, endpoint).create(**call(endpoint, extra, stream))
        return summary(endpoint, result, stream)

    expected = outcome(lambda: run(raw))
    with collector.episode() as ep:
        got = outcome(lambda: run(wrapped))
        assert ep.inflight == 0
    assert got == expected, (endpoint, extra, stream)
    return got


def compare_async(fake: FakeVLLM, endpoint: str, extra: dict[str, Any], stream: bool) -> Any:
    raw, wrapped, _ = clients(fake, is_async=True)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(wrapped)

    async def run(client: Any) -> Any:
        result = await resource(client, endpoint).create(**call(endpoint, extra, stream))
        if stream:
            return [_chunk_text(endpoint, c) async for c in result]
        return summary(endpoint, result, stream)

    async def main() -> tuple[Any, Any]:
        expected = await aoutcome(lambda: run(raw))
        async with collector.episode() as ep:
            got = await aoutcome(lambda: run(wrapped))
            assert ep.inflight == 0
        return expected, got

    expected, got = asyncio.run(main())
    assert got == expected, (endpoint, extra, stream)
    return got


# ---- ~20 field families capture reads or adds, odd values of each ----

FAMILIES: list[tuple[str, dict[str, Any]]] = [
    ("chat", {"n": "two"}),
    ("chat", {"n": [2]}),
    ("chat", {"n": {}}),
    ("chat", {"n": "2.0", "temperature": 1}),
    ("chat", {"top_logprobs": 2}),
    ("chat", {"top_logprobs": "x"}),
    ("chat", {"logprobs": "maybe"}),
    ("chat", {"logprobs": None}),
    ("chat", {"return_token_ids": "yes"}),
    ("chat", {"return_token_ids": 7}),
    ("chat", {"stream_options": {"include_usage": "x"}}),
    ("chat", {"include_reasoning": []}),
    ("chat", {"kv_transfer_params": "x"}),
    ("chat", {"kv_transfer_params": []}),
    ("chat", {"max_tokens": "lots"}),
    ("completions", {"n": "two"}),
    ("completions", {"logprobs": "x"}),
    ("completions", {"logprobs": 2.5}),
    ("completions", {"return_token_ids": []}),
    ("completions", {"echo": True}),
    ("completions", {"echo": "yes", "logprobs": 1}),
    ("completions", {"echo": True, "return_token_ids": True}),
    ("responses", {"include": "message.output_text.logprobs"}),
    ("responses", {"include": [5]}),
    ("responses", {"top_logprobs": "x"}),
    ("responses", {"top_logprobs": 30}),
    ("responses", {"top_logprobs": 5}),
    ("responses", {"enable_response_messages": "x"}),
    ("responses", {"kv_transfer_params": 5}),
]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(("endpoint", "extra"), FAMILIES, ids=lambda v: str(v))
def test_wrapped_sync_client_gets_what_the_unwrapped_one_gets(
    fake: FakeVLLM, endpoint: str, extra: dict[str, Any], stream: bool
) -> None:
    compare_sync(fake, endpoint, extra, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize(("endpoint", "extra"), FAMILIES, ids=lambda v: str(v))
def test_wrapped_async_client_gets_what_the_unwrapped_one_gets(
    fake: FakeVLLM, endpoint: str, extra: dict[str, Any], stream: bool
) -> None:
    compare_async(fake, endpoint, extra, stream)


def test_the_odd_families_are_refused_and_counted_uncaptured(fake: FakeVLLM) -> None:
    """The comparison above is meaningful: the fake refuses these, and the wrapped client's
    request went out uncaptured (counted) rather than failing in capture."""
    _, wrapped, _ = clients(fake, is_async=False)
    collector = tito.Collector()
    collector.wrap(wrapped)
    with collector.episode():
        for extra in ({"n": "two"}, {"n": [2]}, {"logprobs": "maybe"}):
            got = outcome(lambda e=extra: wrapped.chat.completions.create(**call("chat", e, False)))
            assert got[0] == 400
    assert collector.stats.uncaptured_requests == 3
    assert collector.stats.requests == 0


def test_echo_is_sent_as_written_and_counted(fake: FakeVLLM) -> None:
    """`return_token_ids` makes vLLM stop echoing the prompt text: a completions request with
    `echo` goes out as written (the caller's text starts with its prompt), counted uncaptured."""
    _, wrapped, recorder = clients(fake, is_async=False)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(wrapped)
    with collector.episode() as ep:
        answer = wrapped.completions.create(**call("completions", {"echo": True}, False))
    assert answer.choices[0].text.startswith("Once upon a time")
    assert b"return_token_ids" not in recorder.bodies[0] and b'"logprobs"' not in recorder.bodies[0]
    assert collector.stats.uncaptured_requests == 1 and ep.calls == []


def test_n_written_as_a_float_string_is_captured_as_vllm_serves_it(fake: FakeVLLM) -> None:
    _, wrapped, _ = clients(fake, is_async=False)
    collector = tito.Collector()
    collector.wrap(wrapped)
    with collector.episode() as ep:
        wrapped.chat.completions.create(**call("chat", {"n": "2.0", "temperature": 1}, False))
    assert [c.choice_index for c in ep.calls] == [0, 1]
    assert all(c.status.value == "complete" for c in ep.calls)


def test_the_callers_big_integers_reach_the_server_unchanged(fake: FakeVLLM) -> None:
    schema = {"type": "integer", "maximum": 123456789012345678901234567890, "minimum": 1.0}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    _, wrapped, recorder = clients(fake, is_async=False)
    tito.Collector(capture_logprobs=True).wrap(wrapped)
    wrapped.chat.completions.create(model=MODEL, messages=USER, response_format=fmt)  # type: ignore[arg-type]
    assert b'"maximum":123456789012345678901234567890,"minimum":1.0' in recorder.bodies[0]


# ---- hypothesis: arbitrary values of the fields capture reads, wrapped vs unwrapped ----

values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 40),
        st.floats(-2, 30, allow_nan=False),
        st.sampled_from(["2", "2.0", "x", "true", "", "message.output_text.logprobs"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)
READ = {
    "chat": ("n", "logprobs", "top_logprobs", "return_token_ids", "stream", "include_reasoning"),
    "completions": ("n", "logprobs", "return_token_ids", "stream", "echo"),
    "responses": ("include", "top_logprobs", "enable_response_messages", "stream"),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), endpoint=st.sampled_from(sorted(READ)))
def test_fuzzed_fields_get_the_servers_own_answer(
    fake: FakeVLLM, data: st.DataObject, endpoint: str
) -> None:
    fields = data.draw(st.lists(st.sampled_from(READ[endpoint]), unique=True, min_size=1))
    extra = {field: data.draw(values) for field in fields}
    extra.setdefault("temperature", 1)
    # the openai client reads the body by its own `stream` argument
    stream = extra.pop("stream") is True if "stream" in extra else False
    compare_sync(fake, endpoint, extra, stream)


# ---- token-in sessions: odd requests after a first turn ----


def _second_turn(client: Any, first: Any, extra: dict[str, Any]) -> Any:
    message = first.choices[0].message
    messages = [
        *USER,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": "And tomorrow?"},
    ]
    return client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra)


@pytest.mark.parametrize(
    "extra",
    [
        {"kv_transfer_params": "x"},
        {"kv_transfer_params": 5},
        {"kv_transfer_params": []},
        {"kv_transfer_params": {}},
        {"kv_transfer_params": None},
        {"kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}},
        {"kv_transfer_params": {"do_remote_decode": False}},
    ],
    ids=str,
)
def test_token_in_sessions_never_fix_or_crash_on_odd_kv_transfer_params(
    fake: FakeVLLM, extra: dict[str, Any]
) -> None:
    raw, wrapped, recorder = clients(fake, is_async=False)
    collector = tito.Collector()
    collector.wrap(wrapped, sessions=True)
    first_raw = raw.chat.completions.create(model=MODEL, messages=USER)
    expected = outcome(lambda: summary("chat", _second_turn(raw, first_raw, extra), False))
    with collector.episode() as ep:
        first = wrapped.chat.completions.create(model=MODEL, messages=USER)
        got = outcome(lambda: summary("chat", _second_turn(wrapped, first, extra), False))
        assert ep.inflight == 0
    assert got[0] == expected[0]
    if expected[0] != "ok":
        assert got == expected
    sent = json.loads(recorder.bodies[-1])
    kv = extra["kv_transfer_params"]
    if isinstance(kv, dict) and "prompt_token_ids" in kv:  # the caller's own token prompt
        assert sent["kv_transfer_params"] == kv
    elif kv is None or isinstance(kv, dict):  # the caller's entries kept
        assert {**(kv or {}), **sent["kv_transfer_params"]} == sent["kv_transfer_params"]
    else:  # sent as written, no token prompt added
        assert sent["kv_transfer_params"] == extra["kv_transfer_params"]


ODD_ITEMS: list[Any] = [
    {"role": "user", "content": 5},
    {"role": "user", "content": [{"type": ["input_text"], "text": "x"}]},
    {"role": "user", "content": [5]},
    {"type": "function_call", "call_id": 5, "name": ["f"], "arguments": {}},
    {"type": "reasoning", "content": "x"},
    {"type": "reasoning", "summary": 5},
    {"role": "assistant", "content": [{"text": 5}]},
    {"role": "assistant", "tool_calls": "x", "content": "hi"},
    {"type": "function_call_output", "output": {"a": 1}},
    5,
]


@pytest.mark.parametrize("item", ODD_ITEMS, ids=str)
def test_token_in_sessions_with_odd_responses_items_never_crash(fake: FakeVLLM, item: Any) -> None:
    raw, wrapped, _ = clients(fake, is_async=False)
    collector = tito.Collector()
    collector.wrap(wrapped, sessions=True)

    def turns(client: Any) -> Any:
        first = client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}])
        items = [{"role": "user", "content": "hi"}, *first.output, item]
        items = [i.model_dump(exclude_none=True) if hasattr(i, "model_dump") else i for i in items]
        return client.responses.create(model=MODEL, input=items).output_text

    expected = outcome(lambda: turns(raw))
    with collector.episode() as ep:
        got = outcome(lambda: turns(wrapped))
        assert ep.inflight == 0
    assert got[0] == expected[0]
    if expected[0] != "ok":
        assert got == expected
