"""The optional C id parser (`tito_agents._speedups`) against the reference: a full JSON parse.

The project's own installs build it (hatch_build.py with the machine's C compiler), so this suite
requires it; `tito_agents._wire` also has a numpy path without it, tested in test_wire.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tito_agents import _speedups


def parse(text: bytes) -> list[int] | None:
    out = _speedups.parse_ids(text)
    return None if out is None else np.frombuffer(out, dtype=np.int32).tolist()


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**31 - 1), max_size=300),
    spacing=st.sampled_from([(",", ""), (", ", ""), (" ,\n", " ")]),
)
def test_valid_json_id_lists_parse_exactly(ids: list[int], spacing: tuple[str, str]) -> None:
    sep, pad = spacing
    text = (pad + sep.join(map(str, ids)) + pad).encode()
    assert json.loads(b"[" + text + b"]") == ids  # the reference agrees it is valid JSON
    assert parse(text) == ids


@pytest.mark.parametrize(
    "bad",
    [
        b"1,,2",
        b"1,2,",
        b",1",
        b"1, ,2",
        b"-1",
        b"+1",
        b"1.5",
        b"1e3",
        b"01",
        b'"1"',
        b"null",
        b"2147483648",
        b"99999999999999999999",
        b"1 2",
        b"1,\x002",
    ],
)
def test_anything_else_is_refused(bad: bytes) -> None:
    assert parse(bad) is None


@pytest.mark.parametrize("edge", [b"", b"  ", b"0", b"2147483647", b"0,0", b" 7 "])
def test_edges(edge: bytes) -> None:
    assert parse(edge) == json.loads(b"[" + edge + b"]")


def test_result_is_a_writable_buffer() -> None:
    out = _speedups.parse_ids(memoryview(b"1,2,3"))
    assert isinstance(out, bytearray)
    array = np.frombuffer(out, dtype=np.int32)
    array[0] = 9
    assert array.tolist() == [9, 2, 3]
