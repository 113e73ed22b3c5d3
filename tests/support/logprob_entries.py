"""Chat-style logprob entries as vLLM writes them, and as any JSON writer could (hypothesis
strategies and a writer), and one way to read a body back through capture's response parser, for
the property tests of the logprob scans (chat, completions and Responses)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tito_agents._capture.wire import ResponseParser, fastpath, prepare_request
from tito_agents.calls import Endpoint
from tito_agents.errors import MalformedResponseError

tokens = st.text(max_size=8) | st.sampled_from(['"', "\\", "\n", "\x1d", "\u2028", "é", "😀", ""])
finite_logprobs = st.floats(-1e30, 1e30)  # far from float32 overflow (declined: tested apart)
vllm_logprobs = (
    st.floats(-30.0, 0.0)
    | st.floats(-30.0, 0.0, width=32)  # vLLM's logprobs are float32 values written as doubles
    | st.sampled_from([-9999.0, -0.0, 0.0, -5.29852819442749, -5.224366664886475, -1e-45])
    | finite_logprobs
)


def spellings(value: float) -> st.SearchStrategy[str]:
    """Ways a JSON writer may spell a float: shortest repr, exponents of either case and sign,
    more digits than needed."""
    return st.sampled_from(
        [
            repr(value),
            f"{value:.17e}",
            f"{value:.20E}",
            f"{value:.25f}" if abs(value) < 1e6 else repr(value),
            f"{value:e}".replace("e", "e+") if "e-" not in f"{value:e}" else f"{value:e}",
            f"{value:.3e}",
        ]
    )


class Number(str):
    """A number's JSON text, written as is."""


@st.composite
def entry(draw: st.DrawFn, top: bool = True) -> dict[str, Any]:
    """A logprob entry: its fields in any order, some null, its logprob spelled in any way."""
    value = draw(vllm_logprobs)
    fields: dict[str, Any] = {
        "token": draw(tokens),
        "logprob": Number(draw(spellings(value))),
        "bytes": draw(st.none() | st.lists(st.integers(0, 255), max_size=4)),
    }
    if top:
        fields["top_logprobs"] = draw(st.none() | st.lists(entry(top=False), max_size=3))
    keys = draw(st.permutations(list(fields)))
    return {k: fields[k] for k in keys}


def write(entries: list[dict[str, Any]], ascii_only: bool, space: str) -> bytes:
    """The entries as JSON text, `space` around every comma and colon and at both ends."""

    def value(v: Any) -> str:
        if isinstance(v, Number):
            return str(v)
        if isinstance(v, dict):
            items = (f"{json.dumps(k)}{space}:{space}{value(x)}" for k, x in v.items())
            return "{" + f",{space}".join(items) + "}"
        if isinstance(v, list):
            return "[" + f",{space}".join(value(x) for x in v) + "]"
        return json.dumps(v, ensure_ascii=ascii_only)

    return (space + f",{space}".join(map(value, entries)) + space).encode()


ALPHABET = list(b'{}[]",:.-+eE0123456789 \\u\x00\x1f\x7f\xc3\xa9\xed\xa0\xff') + list(b"logprob")
"""Bytes a damaged entry list may gain: JSON's own, escapes, control and non-UTF-8 bytes."""


_REQUESTS: dict[Endpoint, tuple[bytes, bytes]] = {
    Endpoint.CHAT: (b'"messages":[]', b',"logprobs":true'),
    Endpoint.COMPLETIONS: (b'"prompt":"p"', b',"logprobs":0'),
    Endpoint.RESPONSES: (
        b'"input":"hi"',
        b',"include":["message.output_text.logprobs"],"top_logprobs":0',
    ),
}
"""Per endpoint: the request's input field, and how a caller asks for the logprobs itself."""


def read_choices(endpoint: Endpoint, body: bytes, *, added: bool) -> tuple[Any, bytes | None]:
    """The choices of `body` as capture reads them (or the error) and the caller's copy; `added`:
    capture asked for the logprobs (the caller did not). Responses choices carry their message
    too, since the scan also finds the output message there."""
    field, asks = _REQUESTS[endpoint]
    request = b'{"model":"m",' + field + (b"" if added else asks) + b"}"
    prepared = prepare_request(endpoint, request, capture_logprobs=added)
    assert prepared is not None
    assert prepared[1].wants_logprobs
    parser = ResponseParser(prepared[1])
    try:
        choices = parser.parse_body(body)
    except MalformedResponseError as exc:
        return ("raised", str(exc)), None
    return [
        (
            c.sampled_ids.tolist() if c.sampled_ids is not None else None,
            c.logprobs.view(np.uint32).tolist() if c.logprobs is not None else None,
            c.logprobs.dtype if c.logprobs is not None else None,
            repr(c.error),
            *((c.message,) if endpoint is Endpoint.RESPONSES else ()),
        )
        for c in choices
    ], parser.caller_body()


@contextmanager
def without_helper() -> Iterator[None]:
    """Capture's parsers with the optional C helper taken away: the pure-Python path."""
    saved = fastpath._speedups
    fastpath._speedups = None  # type: ignore[assignment]
    try:
        yield
    finally:
        fastpath._speedups = saved


def byte_edits(alphabet: list[int]) -> st.SearchStrategy[list[tuple[int, int, str]]]:
    """One to three edits of a text: (where, a byte of `alphabet`, insert/delete/replace)."""
    edit = st.tuples(st.integers(0, 10_000), st.sampled_from(alphabet), st.sampled_from("idr"))
    return st.lists(edit, min_size=1, max_size=3)


def damage(text: bytes, edits: list[tuple[int, int, str]]) -> bytes:
    """`text` with `edits` applied in turn (positions wrap around the text's length)."""
    out = bytearray(text)
    for at, byte, how in edits:
        at %= len(out) + 1
        if how == "i":
            out[at:at] = bytes([byte])
        elif how == "d":
            del out[at : at + 1]
        else:
            out[at : at + 1] = bytes([byte])
    return bytes(out)
