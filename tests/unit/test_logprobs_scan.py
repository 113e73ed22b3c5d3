"""Chat logprobs read from the body bytes (`_speedups.chat_logprobs`) against the reference: the
full parse (orjson, then `float32(entry["logprob"])`), bit for bit.

The scan may decline (None) anything; what it answers must be exactly what the full parse gives.
It must also answer for everything vLLM writes, or it saves nothing. The parser tests run a body
both ways (the C helper, and without it: the full parse) and compare every result and error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.logprob_entries import (
    ALPHABET,
    byte_edits,
    damage,
    entry,
    read_choices,
    vllm_logprobs,
    without_helper,
    write,
)
from tito_agents import _speedups
from tito_agents._capture.chat.parser import _chat_logprobs
from tito_agents._capture.wire import fastpath
from tito_agents.calls import Endpoint
from tito_agents.errors import MalformedResponseError


def scan(text: bytes) -> np.ndarray | None:
    """The scan of `text` as the entries of an array: None unless it reads them all and stops
    at the array's closing bracket (an earlier bracket ends other entries than `text`'s)."""
    out = _speedups.chat_logprobs(b"[" + text + b"]", 1)
    if out is None or out[0] != len(text) + 1:
        return None
    return np.frombuffer(out[1], dtype=np.float32)


def reference(text: bytes) -> np.ndarray | str:
    """The full parse: the logprobs, or what went wrong (which the scan must leave to it)."""
    try:
        entries = orjson.loads(b"[" + text + b"]")
    except orjson.JSONDecodeError:
        return "invalid JSON"
    try:
        values = _chat_logprobs({"content": entries}, "logprobs")
    except MalformedResponseError:
        return "malformed"
    except Warning:  # pytest turns numpy's float32 overflow warning into an error
        return "warning"
    assert values is not None
    return values


def same_bits(got: np.ndarray, want: np.ndarray | str) -> bool:
    return (
        isinstance(want, np.ndarray)
        and got.shape == want.shape
        and got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    )


def check(text: bytes) -> np.ndarray | None:
    """The scan of `text`, asserted equal to the full parse whenever it answers."""
    got = scan(text)
    if got is not None:
        assert same_bits(got, reference(text)), text
    return got


@settings(max_examples=400, deadline=None)
@given(
    entries=st.lists(entry(), max_size=12),
    ascii_only=st.booleans(),
    space=st.sampled_from(["", " ", "\n  ", "\t", "\r\n"]),
)
def test_every_entry_list_is_read_exactly(
    entries: list[dict[str, Any]], ascii_only: bool, space: str
) -> None:
    text = write(entries, ascii_only, space)
    got = check(text)
    want = reference(text)
    if isinstance(want, np.ndarray) and not np.isinf(want).any():
        assert got is not None  # a plain entry list: the scan must answer, not decline


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(vllm_logprobs, max_size=40),
    tops=st.integers(0, 5),
)
def test_vllm_shaped_entries_are_read_exactly(values: list[float], tops: int) -> None:
    entries = [
        {
            "token": f"t{i}é",
            "logprob": v,
            "bytes": [116, 195, 169],
            "top_logprobs": [{"token": "x", "logprob": v, "bytes": [120]}] * tops,
        }
        for i, v in enumerate(values)
    ]
    text = orjson.dumps(entries)[1:-1]
    got = check(text)
    assert got is not None
    assert got.tolist() == np.array(values, dtype=np.float32).tolist()


@settings(max_examples=1500, deadline=None)
@given(
    entries=st.lists(entry(), min_size=1, max_size=3),
    edits=byte_edits(ALPHABET),
)
def test_damaged_text_is_declined_or_read_exactly(
    entries: list[dict[str, Any]], edits: list[tuple[int, int, str]]
) -> None:
    """Random byte edits (most make invalid JSON, some a different valid one): the scan answers
    only what the full parse gives, and declines whatever the full parse refuses."""
    text = damage(write(entries, ascii_only=False, space=""), edits)
    got = check(text)
    if not isinstance(reference(text), np.ndarray):
        assert got is None


@pytest.mark.parametrize(
    "text",
    [
        b'{"logprob":-1}',  # a JSON integer: a Python int in the full parse
        b'{"logprob":-0}',
        b'{"logprob":123456789012345678901234567890}',
        b'{"token":"a"}',  # no logprob: KeyError in the full parse
        b"{}",
        b"null",
        b"[]",
        b'"x"',
        b'{"logprob":null}',
        b'{"logprob":"-1.5"}',
        b'{"logprob":true}',
        b'{"logprob":-1.5,"logprob":-2.5}',  # repeated: the full parse keeps the last
        b'{"log\\u0070rob":-1.5}',  # the key spelled with an escape
        b'{"token":"\\ud800","logprob":-1.5}',  # lone surrogates: orjson refuses them
        b'{"token":"\\udc00","logprob":-1.5}',
        b'{"token":"\\ud800\\u0041","logprob":-1.5}',
        b'{"token":"\\ud800\\ud800","logprob":-1.5}',
        b'{"token":"\xed\xa0\x80","logprob":-1.5}',  # an encoded surrogate: not UTF-8
        b'{"token":"\xc0\x80","logprob":-1.5}',  # overlong
        b'{"token":"\xf4\x90\x80\x80","logprob":-1.5}',  # beyond U+10FFFF
        b'{"token":"\xc3","logprob":-1.5}',  # truncated
        b'{"token":"a\x01","logprob":-1.5}',  # a control character
        b'{"token":"\\x","logprob":-1.5}',
        b'{"logprob":1e400}',  # infinite: orjson refuses it
        b'{"logprob":-1.5,"top_logprobs":[{"logprob":-1e400}]}',  # anywhere
        b'{"logprob":-1.5,"x":1' + b"0" * 400 + b"}",
        b'{"logprob":-1.5,"x":1' + b"0" * 400 + b".5}",
        b'{"logprob":-1e39}',  # a double beyond float32: numpy warns
        b'{"logprob":-3.4028235e38}',  # just beyond float32's max (rounds to it): declined
        b'{"logprob":NaN}',
        b'{"logprob":-Infinity}',
        b'{"logprob":01.5}',
        b'{"logprob":1.}',
        b'{"logprob":.5}',
        b'{"logprob":-1.5},',  # a trailing comma
        b',{"logprob":-1.5}',
        b'{"logprob":-1.5}{"logprob":-1.5}',
        b'{"logprob":-1.5,}',
        b'{"logprob":-1.5,"x":' + b"[" * 40 + b"]" * 40 + b"}",  # deeper than the scan goes
        b'{"logprob":-1.5,"x":tru}',
        b'{"logprob":-1.5,"x":[1,2,]}',
        b'{"logprob":-1.5} \x0c',
        b'{"logprob":-1.5,"logprob":-1.5}',  # repeated
        b'{"logprobs":-1.5}',  # near misses of the keys compared whole: no logprob
        b'{"logprob ":-1.5}',
        b'{"top_logprobs":[{"logprob":-1.5}]}',
        b'{"log\\u0070rob":-1.5}',
        b'{"logprob":-1.5,"token":"a","bytes":[1],"top_logprobs":[],"logprob":-2.5}',
        b'{"logprob":-1.5,"token',  # cut inside a key compared whole
        b'{"logprob',
    ],
)
def test_what_only_the_full_parse_can_say_is_declined(text: bytes) -> None:
    assert scan(text) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (b"", []),
        (b" \n", []),
        (b'{"logprob":-0.0}', [-0.0]),
        (b'{"logprob":-9999.0}', [-9999.0]),
        (b'{"logprob":-1e-400}', [-0.0]),  # underflows to a signed zero, as in orjson
        (b'{"logprob":-3.4028234663852886e38}', [-3.4028234663852886e38]),  # float32's max
        (b'{"logprob":-2.4703282292062328e-324}', [-0.0]),
        (b'{"logprob":-9007199254740993.0}', [-9007199254740992.0]),  # past 2**53
        (b'{"logprob":-0.1000000000000000055511151231257827}', [-0.1]),
        (b'{"logprob":-1E+2}', [-100.0]),
        (b'{ "logprob" : -1.5 , "bytes" : null } , {"logprob":-2.5e-0}', [-1.5, -2.5]),
        (b'{"token":"\\ud83d\\ude00","logprob":-1.5}', [-1.5]),  # a surrogate pair
        (b'{"token":"\\u00e9\\"]},\\\\","logprob":-1.5,"top_logprobs":[{}]}', [-1.5]),
        (b'{"tokens":1,"token":"t","top_logprobs":[{"logprob":-9.5}],"logprob":-1.5}', [-1.5]),
        (b'{"bytes":[],"byte":[1],"logprob":-1.5,"logprobs":-2.5,"logprob_":null}', [-1.5]),
    ],
)
def test_edge_numbers_are_read_exactly(text: bytes, want: list[float]) -> None:
    got = check(text)
    assert got is not None
    assert got.tolist() == np.array(want, dtype=np.float32).tolist()
    assert [math.copysign(1, v) for v in got.tolist()] == [math.copysign(1, v) for v in want]


# ---- the chat parser, both ways ----


def chat_body(content: bytes, ids: list[int], after: bytes = b"") -> bytes:
    """A vLLM 0.32-shaped chat body, long enough to be cut, with `content` as the entries and
    `after` after them in the logprobs object."""
    prompt = ",".join(str(i % 50_000) for i in range(700)).encode()
    return (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{'
        b'"index":0,"message":{"role":"assistant","content":"x"},"logprobs":{"content":['
        + content
        + b"]"
        + after
        + b'},"finish_reason":"stop","stop_reason":null,"token_ids":['
        + ",".join(map(str, ids)).encode()
        + b'],"routed_experts":null}],"usage":{"prompt_tokens":700,"completion_tokens":'
        + str(len(ids)).encode()
        + b',"total_tokens":1},"prompt_logprobs":null,"prompt_token_ids":['
        + prompt
        + b"]}"
    )


def parse(body: bytes, *, added: bool) -> tuple[Any, bytes | None]:
    return read_choices(Endpoint.CHAT, body, added=added)


@settings(max_examples=150, deadline=None)
@given(
    entries=st.lists(entry(), max_size=8),
    extra=st.integers(-1, 1),
    added=st.booleans(),
    damage=st.none() | st.tuples(st.integers(0, 10_000), st.sampled_from(ALPHABET)),
)
def test_chat_bodies_parse_the_same_with_and_without_the_scan(
    entries: list[dict[str, Any]],
    extra: int,
    added: bool,
    damage: tuple[int, int] | None,
) -> None:
    """Results, errors and the caller's copy are the same whether the scan reads the logprobs or
    the entries are parsed whole (also for counts that do not match, and damaged entries)."""
    content = bytearray(write(entries, ascii_only=False, space=""))
    if damage is not None:
        at, byte = damage
        at %= len(content) + 1
        content[at:at] = bytes([byte])
    body = chat_body(bytes(content), list(range(3, 3 + max(0, len(entries) + extra))))
    fast = parse(body, added=added)
    with without_helper():
        assert parse(body, added=added) == fast


@pytest.mark.parametrize("after", [b',"refusal":null', b" ", b',"content":[]', b',"x":"]},"'])
@pytest.mark.parametrize("added", [False, True])
def test_what_follows_the_entries_changes_nothing(after: bytes, added: bool) -> None:
    """The scan finds the entries' end itself; the full parse needs vLLM's layout after them
    (here not met): both give the same results and the same caller's copy."""
    entries = b'{"token":"a","logprob":-1.5,"bytes":[97],"top_logprobs":[]}'
    body = chat_body(b",".join([entries] * 3), [5, 6, 7], after)
    fast = parse(body, added=added)
    with without_helper():
        assert parse(body, added=added) == fast
    want = [] if b"content" in after else [-1.5] * 3  # a repeated key: the last one counts
    assert fast[0][0][1] == np.array(want, dtype=np.float32).view(np.uint32).tolist()


def test_the_scan_reads_a_vllm_body() -> None:
    """The fast path is taken for what vLLM sends (a decline would cost the full parse)."""
    entries = b",".join(
        b'{"token":"t%d","logprob":-%d.25,"bytes":[116],"top_logprobs":[]}' % (i, i)
        for i in range(20)
    )
    body = chat_body(entries, list(range(20)))
    segments = fastpath._BodySegments.split(body, "chat", logprobs=True)
    assert segments is not None
    got = segments.logprobs(fastpath._MARK + "0")
    assert got is not None and got.tolist() == [-i - 0.25 for i in range(20)]
    assert bytes(segments._raw[0]) == entries
    with without_helper():
        segments = fastpath._BodySegments.split(body, "chat", logprobs=True)
        assert segments is not None and bytes(segments._raw[0]) == entries
        assert segments.logprobs(fastpath._MARK + "0") is None
