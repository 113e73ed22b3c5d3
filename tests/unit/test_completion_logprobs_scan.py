"""Completions logprobs read from the body bytes (`_speedups.completion_logprobs`) against the
reference: the full parse (orjson, then `np.array(token_logprobs, dtype=np.float32)`), bit for
bit. As for chat (`test_logprobs_scan.py`), the scan may decline anything; what it answers must
be exactly what the full parse gives, and the parser gives the same results, errors and caller's
copy with and without it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.logprob_entries import byte_edits, damage, read_choices, without_helper
from tito_agents import _speedups
from tito_agents._capture.chat.parser import _completion_logprobs
from tito_agents._capture.wire import fastpath
from tito_agents.calls import Endpoint
from tito_agents.errors import MalformedResponseError


def scan(members: bytes) -> np.ndarray | None:
    """The scan of `members` as a logprobs object's: None unless it reads them all and stops at
    the object's closing brace."""
    out = _speedups.completion_logprobs(b"{" + members + b"}", 1)
    if out is None or out[0] != len(members) + 1:
        return None
    return np.frombuffer(out[1], dtype=np.float32)


def reference(members: bytes) -> np.ndarray | str:
    """The full parse: the logprobs, or what went wrong (which the scan must leave to it)."""
    try:
        logprobs = orjson.loads(b"{" + members + b"}")
    except orjson.JSONDecodeError:
        return "invalid JSON"
    try:
        values = _completion_logprobs(logprobs, "logprobs")
    except MalformedResponseError:
        return "malformed"
    except Warning:  # pytest turns numpy's float32 overflow warning into an error
        return "warning"
    return "none" if values is None else values


def check(members: bytes) -> np.ndarray | None:
    """The scan of `members`, asserted equal to the full parse whenever it answers."""
    got = scan(members)
    if got is not None:
        want = reference(members)
        assert isinstance(want, np.ndarray), members
        assert got.dtype == want.dtype and got.shape == want.shape, members
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), members
    return got


class Number(str):
    """A number's JSON text, written as is."""


logprob_values = (
    st.floats(-30.0, 0.0)
    | st.floats(-30.0, 0.0, width=32)
    | st.sampled_from([-9999.0, -0.0, 0.0, -5.29852819442749, -1e-45])
    | st.floats(-1e30, 1e30)
)


@st.composite
def spelled(draw: st.DrawFn) -> Number:
    value = draw(logprob_values)
    return Number(draw(st.sampled_from([repr(value), f"{value:.17e}", f"{value:.3E}"])))


@st.composite
def logprobs_object(draw: st.DrawFn) -> dict[str, Any]:
    """A completions logprobs object: its members in any order, nulls where vLLM writes them
    (an echoed first token), unicode tokens, top maps, sometimes an extra member."""
    n = draw(st.integers(0, 8))
    values: list[Any] = [draw(spelled()) for _ in range(n)]
    if n and draw(st.booleans()):
        values[0] = None
    tokens = draw(st.lists(st.text(max_size=4), min_size=n, max_size=n))
    fields: dict[str, Any] = {
        "text_offset": list(range(n)),
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": [
            None if v is None else {t: v, "\u2028é": Number("-1.5")}
            for t, v in zip(tokens, values, strict=True)
        ],
    }
    if draw(st.booleans()):
        fields["extra"] = draw(st.none() | st.integers() | st.lists(st.booleans()))
    keys = draw(st.permutations(list(fields)))
    return {k: fields[k] for k in keys}


def write(obj: Any, space: str = "") -> str:
    """`obj` as JSON text, numbers as spelled, `space` around commas and colons."""
    if isinstance(obj, Number):
        return str(obj)
    if isinstance(obj, dict):
        items = (f"{json.dumps(k)}{space}:{space}{write(v, space)}" for k, v in obj.items())
        return "{" + f",{space}".join(items) + "}"
    if isinstance(obj, list):
        return "[" + f",{space}".join(write(v, space) for v in obj) + "]"
    return json.dumps(obj, ensure_ascii=False)


def members(obj: dict[str, Any], space: str = "") -> bytes:
    return write(obj, space).encode()[1:-1]


@settings(max_examples=300, deadline=None)
@given(obj=logprobs_object(), space=st.sampled_from(["", " ", "\n  "]))
def test_every_logprobs_object_is_read_exactly(obj: dict[str, Any], space: str) -> None:
    text = members(obj, space)
    got = check(text)
    plain = None not in obj["token_logprobs"]
    if plain and isinstance(reference(text), np.ndarray):
        assert got is not None  # what vLLM writes: the scan must answer, not decline


ALPHABET = list(b'{}[]",:.-+eE0123456789 \\nul\x00\xc3\xff') + list(b"token_logprobs")


@settings(max_examples=1000, deadline=None)
@given(
    obj=logprobs_object(),
    edits=byte_edits(ALPHABET),
)
def test_damaged_objects_are_declined_or_read_exactly(
    obj: dict[str, Any], edits: list[tuple[int, int, str]]
) -> None:
    text = damage(members(obj), edits)
    got = check(text)
    if not isinstance(reference(text), np.ndarray):
        assert got is None


@pytest.mark.parametrize(
    "text",
    [
        b'"token_logprobs":[null,-1.5]',  # an echoed first token: nan in the full parse
        b'"token_logprobs":[-1,-1.5]',  # an integer
        b'"token_logprobs":null',
        b'"tokens":[]',  # no token_logprobs
        b"",
        b'"token_logprobs":[-1.5],"token_logprobs":[-2.5]',
        b'"token_\\u006cogprobs":[-1.5]',
        b'"token_logprobs":[-1.5,]',
        b'"token_logprobs":[-1e39]',  # float32 overflow: numpy warns
        b'"token_logprobs":[-1.5],',
        b'"token_logprobs":[-1.5]]',
        b'"token_logprobs":[[-1.5]]',
        b'"token_logprobs":{"a":-1.5}',
    ],
)
def test_what_only_the_full_parse_can_say_is_declined(text: bytes) -> None:
    assert scan(text) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (b'"token_logprobs":[]', []),
        (b' "token_logprobs" : [ -1.5 , -0.0 ] ', [-1.5, -0.0]),
        (b'"text_offset":[0],"token_logprobs":[-9999.0],"top_logprobs":[{"}":-1.0}]', [-9999.0]),
        (b'"token_logprobs":[-1e-400,-2.5E+1]', [-0.0, -25.0]),
    ],
)
def test_edge_objects_are_read_exactly(text: bytes, want: list[float]) -> None:
    got = check(text)
    assert got is not None and got.tolist() == want


# ---- the completions parser, both ways ----


def completions_body(logprobs: bytes, ids: list[int]) -> bytes:
    """A vLLM 0.32-shaped completions body, long enough to be cut, `logprobs` its logprobs."""
    prompt = ",".join(str(i % 50_000) for i in range(700)).encode()
    return (
        b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{'
        b'"index":0,"text":"x","logprobs":'
        + logprobs
        + b',"finish_reason":"length","stop_reason":null,"token_ids":['
        + ",".join(map(str, ids)).encode()
        + b'],"prompt_logprobs":null,"prompt_token_ids":['
        + prompt
        + b']}],"usage":{"prompt_tokens":700,"completion_tokens":'
        + str(len(ids)).encode()
        + b',"total_tokens":1}}'
    )


def parse(body: bytes, *, added: bool) -> tuple[Any, bytes | None]:
    return read_choices(Endpoint.COMPLETIONS, body, added=added)


@settings(max_examples=150, deadline=None)
@given(
    obj=logprobs_object(),
    extra=st.integers(-1, 1),
    added=st.booleans(),
    damage=st.none() | st.tuples(st.integers(0, 10_000), st.sampled_from(ALPHABET)),
)
def test_completions_bodies_parse_the_same_with_and_without_the_scan(
    obj: dict[str, Any], extra: int, added: bool, damage: tuple[int, int] | None
) -> None:
    """Results, errors and the caller's copy are the same whether the scan reads the logprobs or
    the object is parsed whole (also for counts that do not match, and damaged objects)."""
    text = bytearray(write(obj).encode())
    if damage is not None:
        at, byte = damage
        at %= len(text) + 1
        text[at:at] = bytes([byte])
    n = max(0, len(obj["token_logprobs"]) + extra)
    body = completions_body(bytes(text), list(range(3, 3 + n)))
    fast = parse(body, added=added)
    with without_helper():
        assert parse(body, added=added) == fast


def test_the_scan_reads_a_vllm_completions_body() -> None:
    """The fast path is taken for what vLLM sends, and the caller's copy is the server's body but
    for what capture added (logprobs, ids); without the C helper the object stays uncut."""
    logprobs = {
        "text_offset": [0, 2],
        "token_logprobs": [-0.25, -1.5],
        "tokens": ["ab", "c"],
        "top_logprobs": [{"ab": -0.25}, {"c": -1.5}],
    }
    body = completions_body(orjson.dumps(logprobs), [7, 8])
    segments = fastpath._BodySegments.split(body, "completions", logprobs=True)
    assert segments is not None and segments._objects == {0}
    got = segments.logprobs(fastpath._MARK + "0")
    assert got is not None and got.tolist() == [-0.25, -1.5]
    assert segments.restore(segments.skeleton) == body
    choices, caller = parse(body, added=True)
    assert choices[0][1] == np.array([-0.25, -1.5], dtype=np.float32).view(np.uint32).tolist()
    want = orjson.loads(body)
    want["choices"][0].update(logprobs=None, token_ids=None, prompt_token_ids=None)
    assert caller is not None and orjson.loads(caller) == want
    with without_helper():
        segments = fastpath._BodySegments.split(body, "completions", logprobs=True)
        assert segments is not None and not segments._objects


@pytest.mark.parametrize("read", [_speedups.chat_logprobs, _speedups.completion_logprobs])
def test_a_start_outside_the_data_is_refused(read: Any) -> None:
    with pytest.raises(ValueError):
        read(b"[]", 3)
    with pytest.raises(ValueError):
        read(b"[]", -1)
    with pytest.raises(TypeError):
        read(b"[]")
    assert read(b"", 0) is None  # no closing bracket: nothing sure
