"""One definition of "complete", "incomplete" and "unusable" for every count of calls: the
episode report, the collector's stats and the gateway's report all use `calls.count_calls`."""

from __future__ import annotations

from typing import Any

import tito_agents as tito
from tests.support.call_factory import make_call
from tests.support.capture_replay import (
    MSG,
    Capture,
    Replay,
    load_capture,
    replay_clients,
    run_sync,
)
from tito_agents.calls import CallCounts, CallStatus, count_calls
from tito_agents.testing import captured_samples


def _collector(cap: Capture) -> tuple[tito.Collector, Any]:
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    return collector, client


def test_count_calls_counts_each_status_once() -> None:
    """The three counts add up to the calls given; nothing else is counted."""
    statuses = [CallStatus.COMPLETE] * 3 + [CallStatus.INCOMPLETE] * 2 + [CallStatus.UNUSABLE]
    counts = count_calls(make_call(f"r{i}/0", [1], [2], status=s) for i, s in enumerate(statuses))
    assert counts == CallCounts(complete=3, incomplete=2, unusable=1)
    assert counts.calls == 6
    assert count_calls([]) == CallCounts()


def test_a_call_in_flight_at_the_episode_end_is_in_flight_then_late() -> None:
    """A stream still unread when its episode ends is no call of it (neither incomplete nor
    complete): `report.in_flight` counts it; read to its end later, it is a late call."""
    collector, client = _collector(load_capture("chat_stream"))
    with collector.episode() as ep:
        stream = client.chat.completions.create(model="tiny", messages=MSG, stream=True)
    report = ep.report
    assert (report.calls, report.complete, report.incomplete, report.unusable) == (0, 0, 0, 0)
    assert report.in_flight == 1
    chunks = list(stream)
    assert chunks and ep.inflight == 0 and ep.calls == []
    stats = collector.stats
    assert (stats.late_calls, stats.complete_calls, stats.incomplete_calls) == (1, 0, 0)
    assert captured_samples(collector) == []


def test_a_stream_cut_mid_way_is_incomplete_everywhere() -> None:
    """A stream that ends before `[DONE]` (failed mid-stream) is incomplete in the episode
    report and in the stats alike, and never in flight."""
    cap = load_capture("chat_stream")
    cut = Capture(cap.name + "-cut", cap.path, cap.request, cap.status, b"".join(cap.events()[:3]))
    collector, client = _collector(cut)
    with collector.episode() as ep:
        run_sync(client, cut)
    assert (ep.report.calls, ep.report.incomplete, ep.report.in_flight) == (1, 1, 0)
    assert (collector.stats.incomplete_calls, collector.stats.complete_calls) == (1, 0)


def test_an_abandoned_stream_is_incomplete_everywhere() -> None:
    """A stream its caller closes before the end (abandoned) is incomplete, counted the same way
    in the episode report and the stats."""
    collector, client = _collector(load_capture("chat_stream"))
    with collector.episode() as ep:
        stream = client.chat.completions.create(model="tiny", messages=MSG, stream=True)
        next(iter(stream))
        stream.close()
    assert (ep.report.calls, ep.report.incomplete, ep.report.in_flight) == (1, 1, 0)
    assert (collector.stats.incomplete_calls, collector.stats.complete_calls) == (1, 0)


def test_a_redelivered_response_is_a_duplicate_not_a_second_call() -> None:
    """The stats count a re-delivered response (same call ids) as a duplicate only, as the
    episode report, which records it once."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode() as ep:
        for _ in range(2):
            client.chat.completions.create(model="tiny", messages=MSG)
    assert (ep.report.calls, ep.report.complete) == (1, 1)
    assert (collector.stats.complete_calls, collector.stats.duplicate_calls) == (1, 1)
