"""Responses logprobs read from the body bytes: each output text part's entries are cut out and
read by the C helper (`_speedups.chat_logprobs`, the same entry shape as chat, tested bit for bit
in `test_logprobs_scan.py`). The parser gives the same results, errors and caller's copy with the
helper as without it (the whole body parsed), whatever the entries, the parts and the damage."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.logprob_entries import ALPHABET, entry, read_choices, without_helper, write
from tito_agents._capture.wire import fastpath
from tito_agents.calls import Endpoint


def part(entries: bytes | None) -> bytes:
    """An output text part as vLLM 0.32 writes it, `entries` its logprob entries' text."""
    logprobs = b"null" if entries is None else b"[" + entries + b"]"
    return b'{"annotations":[],"text":"Yes.","type":"output_text","logprobs":' + logprobs + b"}"


def responses_body(parts: list[bytes], ids: list[int]) -> bytes:
    """A vLLM 0.32-shaped Responses body (one message item holding `parts`), long enough to be
    cut, the output messages holding `ids`."""
    prompt = ",".join(str(i % 50_000) for i in range(700)).encode()
    return (
        b'{"id":"resp_1","created_at":1,"incomplete_details":null,"instructions":null,'
        b'"metadata":null,"model":"m","object":"response","output":[{"id":"msg_1","content":['
        + b",".join(parts)
        + b'],"role":"assistant","status":"completed","type":"message","phase":null}],'
        b'"parallel_tool_calls":true,"status":"completed","top_logprobs":0,"usage":'
        b'{"input_tokens":700,"output_tokens":'
        + str(len(ids)).encode()
        + b',"total_tokens":1},"input_messages":[{"message":"m","tokens":['
        + prompt
        + b'],"type":"raw_message_tokens"}],"output_messages":[{"message":"Yes.","tokens":['
        + ",".join(map(str, ids)).encode()
        + b'],"type":"raw_message_tokens"}]}'
    )


def parse(body: bytes, *, added: bool) -> tuple[Any, bytes | None]:
    return read_choices(Endpoint.RESPONSES, body, added=added)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.none() | st.lists(entry(), max_size=5), min_size=1, max_size=3),
    extra=st.integers(-1, 1),
    added=st.booleans(),
    damage=st.none() | st.tuples(st.integers(0, 10_000), st.sampled_from(ALPHABET)),
)
def test_responses_bodies_parse_the_same_with_and_without_the_scan(
    parts: list[list[dict[str, Any]] | None],
    extra: int,
    added: bool,
    damage: tuple[int, int] | None,
) -> None:
    """Several parts, some without logprobs, some the scan declines (integer logprobs, odd
    spellings, damage): the results and the caller's copy never depend on the helper."""
    texts = [None if p is None else write(p, ascii_only=False, space="") for p in parts]
    if damage is not None:
        at, byte = damage
        i = at % len(texts)
        text = bytearray(texts[i] or b"")
        at %= len(text) + 1
        text[at:at] = bytes([byte])
        texts[i] = bytes(text)
    n = max(0, sum(len(p) for p in parts if p is not None) + extra)
    body = responses_body([part(t) for t in texts], list(range(3, 3 + n)))
    fast = parse(body, added=added)
    with without_helper():
        assert parse(body, added=added) == fast


def test_the_scan_reads_a_vllm_responses_body() -> None:
    """The fast path is taken for what vLLM sends: the ids and every part's entries cut out and
    read, one array for the call; the caller's copy is the server's body but for what capture
    added."""
    entries = [
        b'{"token":"Yes","bytes":[89,101,115],"logprob":-1.1133558750152588,"top_logprobs":[]}',
        b'{"token":".","bytes":[46],"logprob":-0.3625119924545288,"top_logprobs":[]}',
        b'{"token":"<|im_end|>","bytes":[60],"logprob":-0.275734007358551,"top_logprobs":[]}',
    ]
    body = responses_body([part(entries[0]), part(b",".join(entries[1:]))], [10539, 30, 2])
    segments = fastpath._BodySegments.split(body, "responses", logprobs=True)
    assert segments is not None and len(segments._values) == 2  # and the two id arrays:
    assert [bytes(r[:5]) for r in segments._raw] == [b'{"tok', b'{"tok', b"0,1,2", b"10539"]
    choices, caller = parse(body, added=True)
    want = np.array([-1.1133558750152588, -0.3625119924545288, -0.275734007358551], np.float32)
    assert choices[0][1] == want.view(np.uint32).tolist()
    payload = orjson.loads(body)
    for p in payload["output"][0]["content"]:
        p["logprobs"] = None
    payload.update(top_logprobs=None, input_messages=None, output_messages=None)
    assert caller is not None and orjson.loads(caller) == payload
    with without_helper():  # the ids alone are cut out
        segments = fastpath._BodySegments.split(body, "responses", logprobs=True)
        assert segments is not None and len(segments._raw) == 2 and not segments._values
        assert parse(body, added=True) == (choices, caller)


def test_parts_read_and_parts_parsed_mix_in_order() -> None:
    """A part the scan declines (an integer logprob) between parts it reads: the values keep
    their order and bits, as in the full parse."""
    read = b'{"token":"a","logprob":-0.1,"bytes":[97],"top_logprobs":[]}'
    declined = b'{"token":"b","logprob":-2,"bytes":[98],"top_logprobs":[]}'
    for texts in ([read, declined, read], [declined, read], [read, declined], [None, read]):
        body = responses_body([part(t) for t in texts], list(range(3, 3 + len(texts))))
        segments = fastpath._BodySegments.split(body, "responses", logprobs=True)
        assert segments is not None
        assert len(segments._values) == texts.count(read)
        fast = parse(body, added=False)
        want = [-0.1 if t == read else -2.0 for t in texts if t is not None]
        if len(want) == len(texts):
            assert fast[0][0][1] == np.array(want, np.float32).view(np.uint32).tolist()
        with without_helper():
            assert parse(body, added=False) == fast
