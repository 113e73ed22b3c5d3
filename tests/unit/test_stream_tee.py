"""The stream tee holds raw chunks and decodes them in batches (`_capture/tee.py`): what it holds
stays bounded, the call is still recorded at the chunk that ends the stream (before the caller
reads that chunk), and a malformed event still fails the call. Real vLLM 0.32 streams."""

from __future__ import annotations

import json
from typing import Any, cast

import orjson
import pytest

from tests.support.capture_replay import Capture, load_capture
from tito_agents._capture import tee as tee_module
from tito_agents._capture.pending import PendingCall
from tito_agents._capture.tee import StreamTee
from tito_agents._capture.wire import ParsedChoice, ResponseParser, prepare_request
from tito_agents.calls import Endpoint
from tito_agents.episodes import Episode
from tito_agents.errors import CaptureError


class Recorded:
    """A stand-in for the capture core: keeps what the tee records, marks the call finished."""

    def __init__(self) -> None:
        self.records: list[tuple[list[ParsedChoice], CaptureError | None]] = []

    def record(
        self,
        pending: PendingCall,
        parser: ResponseParser,
        choices: list[ParsedChoice],
        status: int,
        *,
        stream: bool,
        incomplete: CaptureError | None = None,
    ) -> None:
        pending.finished = True
        self.records.append((choices, incomplete))


def open_tee(cap: Capture, endpoint: Endpoint = Endpoint.CHAT) -> tuple[StreamTee, Recorded]:
    prepared = prepare_request(endpoint, json.dumps(cap.request).encode(), capture_logprobs=False)
    assert prepared is not None
    pending = PendingCall(
        info=prepared[1],
        episode=cast(Episode, None),  # the tee hands the call on; the stub core ignores it
        agent=None,
        labels={},
        seq=0,
        policy_version=None,
        started_at=0.0,
    )
    core = Recorded()
    return StreamTee(core, pending, 200), core


def sampled_ids(cap: Capture) -> list[int]:
    """The ids the server streamed, read straight from the capture's events."""
    out: list[int] = []
    for event in cap.events():
        payload = event.strip()[6:]
        if payload != b"[DONE]":
            for choice in orjson.loads(payload).get("choices") or []:
                out.extend(choice.get("token_ids") or [])
    return out


def test_the_call_is_recorded_at_the_chunk_that_ends_the_stream() -> None:
    """Fed event by event, nothing is recorded before `[DONE]` and the call is recorded when
    the `[DONE]` chunk is fed, before the transport hands that chunk to the caller."""
    cap = load_capture("real/chat_stream")
    tee, core = open_tee(cap)
    events = cap.events()
    for event in events[:-1]:
        tee.feed(event)
        assert core.records == []
    tee.feed(events[-1])
    ((choices, incomplete),) = core.records
    assert incomplete is None and choices[0].error is None
    assert choices[0].sampled_ids is not None
    assert choices[0].sampled_ids.tolist() == sampled_ids(cap)


def test_held_bytes_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long stream is decoded as it goes: the tee never holds more than `HOLD_BYTES` plus the
    chunk that crossed it, and the ids are whole at the end."""
    monkeypatch.setattr(tee_module, "HOLD_BYTES", 600)
    cap = load_capture("real/chat_stream")
    tee, core = open_tee(cap)
    largest = max(len(e) for e in cap.events())
    for event in cap.events()[:-1]:
        tee.feed(event)
        assert sum(len(c) for c in tee._held) < 600 + largest
    tee.feed(cap.events()[-1])
    ((choices, _),) = core.records
    assert choices[0].sampled_ids is not None
    assert choices[0].sampled_ids.tolist() == sampled_ids(cap)


def test_a_done_split_across_chunks_is_recorded_at_the_end() -> None:
    """`[DONE]` cut in two: no chunk holds the whole mark, so the events wait for the end of
    the stream, which records the same complete call."""
    cap = load_capture("real/chat_stream")
    tee, core = open_tee(cap)
    body = b"".join(cap.events())
    cut = body.rindex(b"[DONE]") + 3
    tee.feed(body[:cut])
    tee.feed(body[cut:])
    assert core.records == []
    tee.end()
    ((choices, incomplete),) = core.records
    assert incomplete is None and choices[0].sampled_ids is not None
    assert choices[0].sampled_ids.tolist() == sampled_ids(cap)


def test_a_caller_closing_early_gets_the_held_events_read_first() -> None:
    """A caller that stops before `[DONE]`: the events held so far are decoded at the close,
    and the call is incomplete, with no sampled ids."""
    cap = load_capture("real/chat_stream")
    tee, core = open_tee(cap)
    for event in cap.events()[:3]:
        tee.feed(event)
    tee.close()
    ((choices, incomplete),) = core.records
    assert incomplete is not None and choices[0].sampled_ids is None
    assert choices[0].prompt_ids is not None  # from the held first event


@pytest.mark.parametrize("where", ["middle", "last"])
def test_a_malformed_event_held_fails_the_call(where: str) -> None:
    """A broken event among held chunks fails the call when they are decoded, as it did when
    each chunk was decoded on arrival; the caller's stream is not touched."""
    cap = load_capture("real/chat_stream")
    tee, core = open_tee(cap)
    events = cap.events()
    at = len(events) // 2 if where == "middle" else len(events) - 2
    events[at] = b'data: {"choices": [\n\n'
    for event in events:
        tee.feed(event)
    ((choices, _),) = core.records
    assert choices[0].error is not None and "not valid JSON" in str(choices[0].error)


def test_a_responses_stream_is_recorded_at_its_final_event() -> None:
    """A Responses stream has no `[DONE]`: the chunk with `response.completed` ends it."""
    cap = load_capture("real/responses_stream")
    tee, core = open_tee(cap, Endpoint.RESPONSES)
    events = cap.events()
    final = next(i for i, e in enumerate(events) if b'"response.completed"' in e)
    for event in events[:final]:
        tee.feed(event)
    assert core.records == []
    tee.feed(events[final])
    ((choices, incomplete),) = core.records
    assert incomplete is None and choices[0].error is None
    data = next(line for line in events[final].splitlines() if line.startswith(b"data: "))
    final_event: dict[str, Any] = orjson.loads(data[6:])
    output = final_event["response"]["output_messages"]
    assert choices[0].sampled_ids is not None
    assert choices[0].sampled_ids.tolist() == [t for m in output for t in m["tokens"]]
