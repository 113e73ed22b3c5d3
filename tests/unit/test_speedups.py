"""The optional C id parser (`tito_agents._speedups`) against the reference: a full JSON parse.

The project's own installs build it (hatch_build.py with the machine's C compiler), so this suite
requires it; `tito_agents._capture.wire.fastpath` also has a numpy path without it, tested in test_wire.py.
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


def reference(text: bytes) -> list[int] | None:
    """What a full JSON parser says: the ids, or None when the text is no list of ids."""
    try:
        value = json.loads(b"[" + text + b"]")
    except ValueError:
        return None
    ok = all(type(v) is int and 0 <= v < 2**31 for v in value)
    return value if ok else None


# vLLM ids are mostly 1-6 digits (the 8-byte fast path); long ones take the digit loop
ids_of_every_width = st.lists(
    st.one_of(st.integers(0, 9), st.integers(0, 99_999), st.integers(0, 2**31 - 1)), max_size=300
)


@settings(max_examples=300, deadline=None)
@given(ids=ids_of_every_width)
def test_compact_lists_of_every_width_parse_exactly(ids: list[int]) -> None:
    assert parse(",".join(map(str, ids)).encode()) == ids


@settings(max_examples=1000, deadline=None)
@given(text=st.text(alphabet="0123456789,, -.\n\x00é", max_size=120).map(str.encode))
def test_any_text_parses_as_a_json_parser_says(text: bytes) -> None:
    got, want = parse(text), reference(text)
    if got is None and want is not None:  # refusing is safe (the full parser then runs); only
        assert b"-" in text  # "-0" is valid JSON for 0 that is refused: vLLM never writes it
    else:
        assert got == want


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(0, 99_999), min_size=1, max_size=60),
    where=st.integers(0, 10_000),
    damage=st.sampled_from([b",", b"0", b"00", b" ", b"-", b"x", b"\xff", b"9999999999"]),
)
def test_damage_anywhere_in_compact_text_is_judged_as_json(
    ids: list[int], where: int, damage: bytes
) -> None:
    text = ",".join(map(str, ids)).encode()
    at = where % (len(text) + 1)
    bad = text[:at] + damage + text[at:]
    got, want = parse(bad), reference(bad)
    assert got == want or (got is None and b"-" in bad)


@pytest.mark.parametrize(
    "edge",
    [
        b"9999999,1",  # 7 digits: the widest the 8-byte path reads
        b"1,10000000,2",  # 8 digits: the digit loop
        b"12345678901234,1",
        b"0,0,0,0,0,0,0,0,0",
        b"1,2147483647,3",
        b"11111111,2147483648",
        b"1234567,",
        b",1234567",
        b"1234567,,1234567",
        b"1234567,0123456",
    ],
)
def test_fast_path_edges(edge: bytes) -> None:
    assert parse(edge) == reference(edge)


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
