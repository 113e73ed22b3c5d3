"""Export, the hand-off of samples to the sink (`tito_agents.export`).

A failing sink never breaks the agent: calls outside an episode queue their samples (never
written inside the call), an episode's exit logs and counts a sink failure, and raises it only
in the strict mode; the default `Collector(path)` rides out a full disk."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

import tito_agents as tito
from tests.support.capture_replay import (
    REPO_ROOT,
    Capture,
    Replay,
    load_capture,
    replay_clients,
    run_async,
    run_sync,
)
from tito_agents import export
from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import BufferedSink, CallbackSink, Sink

HANG_GUARD_S = 60.0
"""How long a test waits for what takes milliseconds before calling it a hang (a guard, never
an outcome: the linger it guards against is an hour)."""


class BrokenSink(Sink):
    """Refuses every write with `error`, and records on which threads it was called."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.threads: list[str] = []

    def write(self, samples: Sequence[Sample]) -> None:
        self.threads.append(threading.current_thread().name)
        raise self.error


def _content(cap_name: str) -> str:
    content = load_capture(cap_name).json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    return content


@pytest.mark.parametrize(
    "error", [SinkError("disk full", retryable=False), RuntimeError("callback bug")]
)
def test_outside_an_episode_the_call_returns_and_the_sink_is_not_called_in_it(
    error: Exception,
) -> None:
    """The agent's call outside any episode returns its response although the sink raises; the
    sink is called from the processor's thread, not from the request; the failure is counted."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    sink = BrokenSink(error)
    collector = tito.Collector(sink)
    collector.wrap(client)
    response = run_sync(client, cap)
    assert response.choices[0].message.content == _content("chat_ns")
    collector.close()
    assert sink.threads == ["tito-processor"]  # written by the processor's thread, not the call
    assert collector.stats.sink_failures == 1 and collector.stats.lost_samples == 1
    assert collector.stats.complete_calls == 1


async def test_outside_an_episode_async_calls_return_too() -> None:
    """Async client, same promise: the coroutine returns the response, nothing raises."""
    cap = load_capture("chat_ns")
    _, client = replay_clients(Replay([cap]))
    collector = tito.Collector(BrokenSink(SinkError("down", retryable=False)))
    collector.wrap(client)
    response = await run_async(client, cap)
    assert response.choices[0].message.content == _content("chat_ns")
    await collector.aclose()
    assert collector.stats.sink_failures == 1 and collector.stats.lost_samples == 1


def test_a_blocked_sink_never_holds_the_call() -> None:
    """A sink that blocks (a full buffer with nowhere to spill waits for room) holds the
    processor's thread, never the agent's call; once it unblocks every sample arrives."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    release = threading.Event()
    inner = CallbackSink(lambda s: release.wait())
    sink = BufferedSink(inner, max_buffer_samples=1, linger=0, spill_dir=None)
    collector = tito.Collector(sink)
    collector.wrap(client)
    for i in range(4):  # distinct response ids: four calls, four samples
        replay.responses = [_with_id(cap, f"chatcmpl-{i}")]
        assert run_sync(client, cap).choices[0].message.content == _content("chat_ns")
    assert collector.stats.lost_samples == 0
    release.set()
    collector.close()
    assert collector.stats.samples == 4 and sink.stats.exported == 4


def _with_id(cap: Capture, response_id: str) -> Capture:
    body = cap.json()
    body["id"] = response_id
    return Capture(cap.name, cap.path, cap.request, cap.status, json.dumps(body).encode())


def test_episode_exit_logs_and_counts_a_sink_failure(caplog: pytest.LogCaptureFixture) -> None:
    """Default: the episode's exit does not raise; the failure is logged once and counted."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(BrokenSink(SinkError("disk full", retryable=True)))
    collector.wrap(client)
    with caplog.at_level(logging.ERROR, logger="tito_agents"), collector.episode("e1"):
        run_sync(client, cap)
    errors = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(errors) == 1 and "disk full" in errors[0].getMessage()
    assert collector.stats.sink_failures == 1 and collector.stats.lost_samples == 1


async def test_async_episode_exit_logs_and_counts_a_sink_failure() -> None:
    cap = load_capture("chat_ns")
    _, client = replay_clients(Replay([cap]))
    collector = tito.Collector(BrokenSink(RuntimeError("callback bug")))
    collector.wrap(client)
    async with collector.episode("e1"):
        await run_async(client, cap)
    assert collector.stats.sink_failures == 1 and collector.stats.lost_samples == 1


def test_strict_mode_raises_the_sink_error_at_episode_exit() -> None:
    """`sink_errors="raise"`: the episode's exit raises the `SinkError` (a non-SinkError from a
    callback is wrapped in one); the agent's calls inside still returned their responses."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(BrokenSink(RuntimeError("bug")), sink_errors="raise")
    collector.wrap(client)
    with pytest.raises(SinkError, match="bug"), collector.episode("e1"):
        response = run_sync(client, cap)
        assert response.choices[0].message.content == _content("chat_ns")
    assert collector.stats.lost_samples == 1


def test_a_path_sink_is_buffered_and_spills_under_the_spill_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Collector(path)` writes through a `BufferedSink` whose spill folder is named after the
    file; the samples are in the file once the collector is flushed."""
    monkeypatch.setenv("TITO_SPILL_DIR", str(tmp_path / "spill"))
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(tmp_path / "samples.jsonl")
    assert isinstance(collector.sink, BufferedSink)
    assert collector.sink.spill_dir is not None
    assert collector.sink.spill_dir.parent == tmp_path / "spill"
    collector.wrap(client)
    with collector.episode("e1"):
        run_sync(client, cap)
    run_sync(client, cap)  # outside any episode
    collector.flush()
    assert len(list(tito.read_samples(tmp_path / "samples.jsonl"))) == 2
    collector.close()


_FULL_DISK_AGENT = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    import tito_agents as tito
    from tests.support.capture_replay import Replay, load_capture, replay_clients
    from tests.support.capture_replay import run_async, run_sync

    path, spill = sys.argv[1], sys.argv[2]
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # the disk fills up at 20 kB
    cap = load_capture("chat_ns")
    expected = cap.json()["choices"][0]["message"]["content"]
    client, aclient = replay_clients(Replay([cap]))
    # the default buffered JSON Lines sink, but one sample per write: the file fills up part-way
    # whatever the worker's batching (a batch of everything would be refused whole)
    sink = tito.sinks.BufferedSink(
        tito.sinks.JsonlSink(path),
        spill_dir=spill,
        block_timeout=0.5,
        close_timeout=1.0,
        batch_size=1,
    )
    collector = tito.Collector(sink)
    collector.wrap(client)
    collector.wrap(aclient)
    answers = 0
    for e in range(15):
        with collector.episode(f"e{e}"):
            answers += run_sync(client, cap).choices[0].message.content == expected
        answers += run_sync(client, cap).choices[0].message.content == expected

    async def agents():
        async with collector.episode("async"):
            return (await run_async(aclient, cap)).choices[0].message.content == expected

    answers += asyncio.run(agents())
    # collector.close(), not sink.close(): the processor's thread still holds the calls made
    # outside an episode; closing the sink under it would refuse them (a race this test once lost).
    try:  # the spill log is on the same full disk: close may have to say what it could not keep
        collector.close()
        close_error = None
    except tito.SinkError as exc:
        close_error = str(exc)
    print(json.dumps({"answers": answers, "stats": collector.stats.as_dict(), "close": close_error}))
    """
)


def test_a_full_disk_never_breaks_the_agent_and_leaves_a_readable_file(tmp_path: Path) -> None:
    """A real file-size limit (EFBIG, as a full disk, the spill folder on the same disk) under the
    default buffered JSON Lines sink: every agent call returns its answer, every episode exits,
    the file reads whole, and every sample that did not fit is accounted for: in the spill
    folder, counted as lost, or named by the error `close` raises. None vanishes silently."""
    path = tmp_path / "samples.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_AGENT, str(path), str(tmp_path / "spill")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["answers"] == 31
    written = list(tito.read_samples(path))
    assert 0 < len(written) < 31  # the limit was hit part-way
    delivery = result["stats"]["delivery"]
    assert delivery["failed_attempts"] >= 1
    named = re.search(r"(\d+) samples not delivered", result["close"] or "")
    not_kept = int(named.group(1)) if named else 0
    spilled = delivery["spill_pending"]
    assert len(written) + spilled + not_kept + result["stats"]["lost_samples"] == 31


_EXIT_WITHOUT_CLOSE = textwrap.dedent(
    """
    import time
    import tito_agents as tito
    from tests.support.capture_replay import Replay, load_capture, replay_clients, run_sync

    def slow_write(samples):
        time.sleep(0.5)  # the processor's thread is still writing when the program ends
        print("written", len(samples), flush=True)

    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(tito.sinks.CallbackSink(slow_write))
    collector.wrap(client)
    run_sync(client, cap)  # outside any episode; no flush, no close
    """
)


def test_calls_outside_an_episode_reach_the_sink_when_the_program_ends_without_close() -> None:
    """The processor's queue is drained at exit before sinks are closed: a script that makes
    a call outside any episode and ends without `close()` still writes its sample."""
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WITHOUT_CLOSE],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "written 1" in done.stdout


def test_calls_outside_an_episode_in_a_burst_are_written_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone call outside any episode is written at once; calls that follow it closely wait
    for each other and are assembled and written in one sink write (a wake-up per call costs
    more than the call's assembly); every call becomes its sample; `flush` ends the wait.

    The linger is an hour, so no outcome depends on timing: a lone call held for it, or a flush
    that waits for it, would never finish, and the hang guards (far shorter) turn that into a
    failure."""
    monkeypatch.setattr(export, "EXPORT_LINGER_S", 3600.0)
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    batches: list[int] = []
    written = threading.Event()

    def write(samples: Sequence[Sample]) -> None:
        batches.append(len(samples))
        written.set()

    collector = tito.Collector(CallbackSink(write))
    collector.wrap(client)
    replay.responses = [_with_id(cap, "chatcmpl-lone")]
    run_sync(client, cap)
    assert written.wait(HANG_GUARD_S), "the lone call was held for the linger"
    assert batches == [1]
    for i in range(5):
        replay.responses = [_with_id(cap, f"chatcmpl-burst-{i}")]
        run_sync(client, cap)
    flushed = threading.Thread(target=collector.flush, daemon=True)
    flushed.start()
    flushed.join(HANG_GUARD_S)
    assert not flushed.is_alive(), "flush waited for the linger"
    assert batches == [1, 5] and collector.stats.samples == 6
    collector.close()


def test_a_forked_child_gets_its_own_processor_thread_and_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After fork the child's calls outside an episode go through a thread of its own (the
    parent's does not exist there), and what the parent had queued is written once, by the
    parent: the child starts with an empty queue."""
    monkeypatch.setattr(export, "EXPORT_LINGER_S", 3600.0)  # the parent's second call waits
    path = tmp_path / "samples.jsonl"
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(tito.sinks.JsonlSink(path))
    collector.wrap(client)
    for name in ("parent-lone", "parent-queued"):
        replay.responses = [_with_id(cap, f"chatcmpl-{name}")]
        run_sync(client, cap)
    pid = os.fork()
    if pid == 0:  # the child: its call is written by its own thread, at once (nothing lingers)
        code = 1
        try:
            replay.responses = [_with_id(cap, "chatcmpl-child")]
            run_sync(client, cap)
            collector.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    collector.close()
    calls = sorted(json.loads(line)["call_ids"][0] for line in path.read_text().splitlines())
    assert calls == [f"chatcmpl-{n}/0" for n in ("child", "parent-lone", "parent-queued")]
