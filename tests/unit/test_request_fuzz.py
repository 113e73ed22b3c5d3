"""Request fuzzing of capture's request side: whatever a caller writes, `prepare_request` either
sends it captured (the caller's bytes kept, nothing the server refuses made acceptable) or says it
cannot read it; never another exception.

The fake vLLM's request validation (vLLM 0.32's, pydantic lax mode) is the judge of "the server
refuses": a request it refuses as the caller wrote it is refused once capture added its fields,
and one it accepts stays accepted."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from tito_agents._capture.wire.request import UnreadableRequest, lax_bool, lax_int, prepare_request
from tito_agents._capture.wire.splice import member_values, set_members, with_token_prompt
from tito_agents.calls import Endpoint
from tito_agents.testing.fake_vllm._requests import (
    FakeHTTPError,
    check_responses,
    parse_chat,
    parse_completion,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---- values: JSON of every shape, odd numbers included ----

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(["2", "2.0", "2.5", " 1 ", "true", "off", "x", "", "1e5", "-1", "0"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)

CHAT_FIELDS = (
    "n",
    "stream",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "include_reasoning",
    "stream_options",
    "kv_transfer_params",
    "tools",
    "response_format",
    "max_tokens",
)
RESPONSES_FIELDS = (
    "enable_response_messages",
    "include",
    "top_logprobs",
    "stream",
    "kv_transfer_params",
    "tools",
    "input",
    "text",
)
COMPLETIONS_FIELDS = ("n", "stream", "logprobs", "return_token_ids", "echo", "max_tokens")

BASES: dict[Endpoint, dict[str, Any]] = {
    Endpoint.CHAT: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    Endpoint.COMPLETIONS: {"model": "m", "prompt": "hi"},
    Endpoint.RESPONSES: {"model": "m", "input": "hi"},
}
# Messages requests are not spliced but converted (capture sends vLLM's own chat conversion of
# them, the request vLLM would run itself): what they must keep and refuse is checked against
# vLLM's converters in tests/unit/test_messages_wire.py and through capture in
# tests/unit/test_messages_capture.py.
SPLICED = [e for e in Endpoint if e is not Endpoint.MESSAGES]
FIELDS = {
    Endpoint.CHAT: CHAT_FIELDS,
    Endpoint.COMPLETIONS: COMPLETIONS_FIELDS,
    Endpoint.RESPONSES: RESPONSES_FIELDS,
}


@st.composite
def requests(draw: st.DrawFn, endpoint: Endpoint) -> dict[str, Any]:
    """A valid base request with some fields capture reads set to arbitrary JSON."""
    body = dict(BASES[endpoint])
    for field in draw(st.lists(st.sampled_from(FIELDS[endpoint]), unique=True, max_size=4)):
        body[field] = draw(json_values)
    return body


def encodings(payload: dict[str, Any]) -> list[bytes]:
    """The same object written several ways (spacing, escapes, key order as given)."""
    return [
        json.dumps(payload).encode(),
        json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode(),
        json.dumps(payload, indent=2).encode() + b"\n",
    ]


def refusal(endpoint: Endpoint, body: bytes) -> str | None:
    """The fake vLLM's refusal of a request body (its message), None where it accepts it."""
    payload = json.loads(body)  # exact integers, as the server's parser reads them
    try:
        if endpoint is Endpoint.CHAT:
            parse_chat(payload, max_model_len=100_000, vocab_size=50_000)
        elif endpoint is Endpoint.COMPLETIONS:
            parse_completion(payload, max_model_len=100_000, vocab_size=50_000)
        else:
            check_responses(payload)
    except FakeHTTPError as exc:
        return exc.message
    return None


def prepared_or_unreadable(endpoint: Endpoint, body: bytes, logprobs: bool) -> bytes | None:
    """The body capture sends (the caller's where it changes nothing or cannot read it)."""
    try:
        prepared = prepare_request(endpoint, body, capture_logprobs=logprobs)
    except UnreadableRequest:
        return body
    if prepared is None or prepared[0] is None:
        return body
    return prepared[0]


@pytest.mark.parametrize("endpoint", SPLICED, ids=lambda e: e.value)
@FUZZ
@given(data=st.data(), logprobs=st.booleans())
def test_capture_never_raises_and_never_makes_a_refused_request_accepted(
    endpoint: Endpoint, data: st.DataObject, logprobs: bool
) -> None:
    payload = data.draw(requests(endpoint))
    for body in encodings(payload):
        sent = prepared_or_unreadable(endpoint, body, logprobs)
        before, after = refusal(endpoint, body), refusal(endpoint, sent)
        assert (before is None) == (after is None), (payload, before, after)


@pytest.mark.parametrize("endpoint", SPLICED, ids=lambda e: e.value)
@FUZZ
@given(data=st.data(), logprobs=st.booleans())
def test_the_callers_bytes_are_kept(
    endpoint: Endpoint, data: st.DataObject, logprobs: bool
) -> None:
    """Every member the caller wrote reaches the server as the same bytes (big integers, float
    spellings, escapes, order); capture's own members come after them or extend theirs."""
    payload = data.draw(requests(endpoint))
    payload["extra"] = data.draw(json_values)
    for body in encodings(payload):
        sent = prepared_or_unreadable(endpoint, body, logprobs)
        spans, sent_spans = member_values(body), member_values(sent)
        for key, (start, end) in spans.items():
            mine, theirs = sent[slice(*sent_spans[key])], body[start:end]
            if key in ("include", "logprobs", "top_logprobs") and mine != theirs:
                # capture extends the caller's include list / fills a null logprobs
                assert theirs == b"null" or mine.startswith(theirs.rstrip()[:-1])
            else:
                assert mine == theirs, key
        assert list(sent_spans)[: len(spans)] == list(spans)


def test_top_logprobs_without_logprobs_stays_refused() -> None:
    body = orjson.dumps({**BASES[Endpoint.CHAT], "top_logprobs": 3})
    sent = prepared_or_unreadable(Endpoint.CHAT, body, logprobs=True)
    assert b'"logprobs"' not in sent
    assert refusal(Endpoint.CHAT, sent) == refusal(Endpoint.CHAT, body) is not None
    # top_logprobs 0 is accepted either way: logprobs are asked for
    zero = orjson.dumps({**BASES[Endpoint.CHAT], "top_logprobs": 0})
    assert b'"logprobs":true' in prepared_or_unreadable(Endpoint.CHAT, zero, logprobs=True)


@pytest.mark.parametrize("value", ["two", [2], {}, "2.5", 2.5, "", "1e1"])
def test_an_unreadable_n_is_sent_as_written(value: Any) -> None:
    body = orjson.dumps({**BASES[Endpoint.CHAT], "n": value})
    with pytest.raises(UnreadableRequest, match=r"^n = "):
        prepare_request(Endpoint.CHAT, body, capture_logprobs=False)


@pytest.mark.parametrize(("value", "n"), [("2.0", 2), ("2", 2), (2.0, 2), (True, 1), (None, 1)])
def test_n_is_read_as_vllm_reads_it(value: Any, n: int) -> None:
    body = orjson.dumps({**BASES[Endpoint.CHAT], "n": value})
    prepared = prepare_request(Endpoint.CHAT, body, capture_logprobs=False)
    assert prepared is not None and prepared[1].n == n


def test_big_integers_and_float_spellings_reach_the_server_unchanged() -> None:
    schema = (
        b'{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"integer",'
        b'"maximum":123456789012345678901234567890,"minimum":1.0,"multipleOf":1e5,'
        b'"description":"caf\\u00e9 \xc3\xa9"}}}'
    )
    body = (
        b'{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":'
        + schema
        + b"}"
    )
    new_body, info = prepare_request(Endpoint.CHAT, body, capture_logprobs=True) or (None, None)
    assert new_body == body[:-1] + b',"return_token_ids":true,"logprobs":true}'
    assert info is not None and info.added_ids and info.added_logprobs


def test_an_explicit_null_logprobs_is_replaced_in_place() -> None:
    body = b'{"logprobs" : null, "model":"m","messages":[{"role":"user","content":"hi"}]}'
    new_body = prepare_request(Endpoint.CHAT, body, capture_logprobs=True)
    assert new_body is not None
    assert new_body[0] == (
        b'{"logprobs" : true, "model":"m","messages":[{"role":"user","content":"hi"}]'
        b',"return_token_ids":true}'
    )


def test_responses_include_is_extended_in_its_own_bytes() -> None:
    body = b'{"model":"m","input":"hi","include":[ "reasoning.encrypted_content" ]}'
    prepared = prepare_request(Endpoint.RESPONSES, body, capture_logprobs=True)
    assert prepared is not None and prepared[0] == (
        b'{"model":"m","input":"hi","include":[ "reasoning.encrypted_content" ,'
        b'"message.output_text.logprobs"],"enable_response_messages":true,"top_logprobs":0}'
    )
    with pytest.raises(UnreadableRequest, match="include"):
        prepare_request(Endpoint.RESPONSES, b'{"input":"x","include":"x"}', capture_logprobs=True)


@pytest.mark.parametrize("top", [-5, 21, 1000])
def test_responses_logprobs_are_not_added_where_vllm_would_then_refuse(top: int) -> None:
    body = orjson.dumps({**BASES[Endpoint.RESPONSES], "top_logprobs": top})
    prepared = prepare_request(Endpoint.RESPONSES, body, capture_logprobs=True)
    assert prepared is not None and prepared[0] is not None
    assert b"include" not in prepared[0] and not prepared[1].wants_logprobs


# ---- the splice primitives ----


@FUZZ
@given(payload=st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_member_values_finds_each_members_bytes(payload: dict[str, Any]) -> None:
    for body in encodings(payload):
        spans = member_values(body)
        assert set(spans) == set(payload)
        for key, (start, end) in spans.items():
            assert json.loads(body[start:end]) == payload[key]


@FUZZ
@given(
    payload=st.dictionaries(st.sampled_from("abcdef"), json_values, max_size=4),
    members=st.dictionaries(st.sampled_from("abcxyz"), json_values, min_size=1, max_size=3),
)
def test_set_members_sets_exactly_the_given_members(
    payload: dict[str, Any], members: dict[str, Any]
) -> None:
    for body in encodings(payload):
        raw = {k: json.dumps(v).encode() for k, v in members.items()}
        assert json.loads(set_members(body, raw, payload)) == {**payload, **members}


def test_a_duplicated_key_is_set_where_parsers_read_it() -> None:
    body = b'{"a": 1, "a": 2}'
    assert member_values(body)["a"] == (14, 15)
    assert set_members(body, {"a": b"3"}, {"a": 2}) == b'{"a": 1, "a": 3}'


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        (None, b'"kv_transfer_params":{"prompt_token_ids":[1,2]}'),
        ({}, b'"kv_transfer_params":{"prompt_token_ids":[1,2]}'),
        (
            {"x": 10**30},
            b'"kv_transfer_params":{"x":' + str(10**30).encode() + b',"prompt_token_ids":[1,2]}',
        ),
    ],
)
def test_the_token_prompt_is_spliced_into_the_callers_kv_transfer_params(
    kv: Any, expected: bytes
) -> None:
    payload = {**BASES[Endpoint.CHAT], "seed": 10**30}
    if kv is not None:
        payload["kv_transfer_params"] = kv
    body = json.dumps(payload, separators=(",", ":")).encode()
    sent = with_token_prompt(body, orjson.loads(body), [1, 2])
    assert expected in sent and str(10**30).encode() in sent
    assert json.loads(sent)["kv_transfer_params"] == {**(kv or {}), "prompt_token_ids": [1, 2]}


@pytest.mark.parametrize("kv", ["x", 5, [], {"prompt_token_ids": [3]}])
def test_the_token_prompt_never_fixes_or_replaces_odd_kv_transfer_params(kv: Any) -> None:
    payload = {**BASES[Endpoint.CHAT], "kv_transfer_params": kv}
    with pytest.raises(ValueError, match="kv_transfer_params"):
        with_token_prompt(orjson.dumps(payload), payload, [1, 2])


# ---- the lax readers agree with pydantic's lax mode, which vLLM's request models use ----

lax_inputs = st.one_of(
    scalars,
    st.from_regex(r"\A[ +\-]?[0-9_]{0,4}(\.[0-9]{0,3})?[ ]?\Z"),
    st.sampled_from(["TRUE", "On", "Y", "nO", " true", "2.", "-2.0", "1_0"]),
)


@FUZZ
@given(value=lax_inputs)
def test_lax_int_reads_what_pydantic_reads(value: Any) -> None:
    try:
        expected: int | None = TypeAdapter(int).validate_python(value)
    except ValidationError:
        expected = None
    try:
        got = lax_int({"f": value}, "f")
    except UnreadableRequest:
        got = None
    if value is not None:
        assert got == expected, value


@FUZZ
@given(value=lax_inputs)
def test_lax_bool_reads_what_pydantic_reads(value: Any) -> None:
    try:
        expected: bool | None = TypeAdapter(bool).validate_python(value)
    except ValidationError:
        expected = None
    try:
        got = lax_bool({"f": value}, "f")
    except UnreadableRequest:
        got = None
    if value is not None:
        assert got == expected, value
