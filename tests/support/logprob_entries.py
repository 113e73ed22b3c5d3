"""Chat-style logprob entries as vLLM writes them, and as any JSON writer could (hypothesis
strategies and a writer), for the property tests of the logprob scans (chat and Responses)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

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
