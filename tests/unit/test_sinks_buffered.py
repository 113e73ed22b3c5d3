"""Fault-tolerant delivery (`BufferedSink`): buffering, retries, spill at the bound, recovery,
close, exit."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.base import Sink
from tito_agents.sinks.buffered import Backoff, BufferedSink
from tito_agents.sinks.files import RotatingFileSink
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.reading import read_samples

FAST = Backoff(initial=0.005, maximum=0.02)


class FlakySink(Sink):
    """A destination that can be down (retryable), refuse (for good), or be slow."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.down = False
        self.refuse: set[str] = set()
        self.delay = 0.0
        self.attempts = 0
        self.closed = False
        self.lock = threading.Lock()
        self.gate = threading.Event()
        """Open: writes go through. Closed (`gate.clear()`): each write waits until it opens."""
        self.gate.set()

    def write(self, samples: Sequence[Sample]) -> None:
        self.attempts += 1
        assert self.gate.wait(60), "the test never opened the gate"
        if self.delay:
            time.sleep(self.delay)
        if self.down:
            raise SinkError("destination down", retryable=True)
        if any(s.sample_id in self.refuse for s in samples):
            raise SinkError("schema mismatch", retryable=False)
        with self.lock:
            self.received.extend(s.sample_id for s in samples)

    def close(self) -> None:
        self.closed = True


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Wait for an event the test caused (the deadline only turns a hang into a failure)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.005)


def make(n: int, start: int = 0, tokens: int = 32) -> list[Sample]:
    return [synthetic_sample(i, tokens) for i in range(start, start + n)]


def ids(samples: Sequence[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


@pytest.fixture
def flaky() -> FlakySink:
    return FlakySink()


def test_write_only_enqueues(flaky: FlakySink) -> None:
    """The hot path returns without waiting for a slow destination; flush waits for it."""
    flaky.gate.clear()  # the destination holds every write until the test opens it
    sink = BufferedSink(flaky, linger=0)
    sink.write(make(5))  # returns although nothing can be delivered yet
    assert flaky.received == [] and sink.pending == 5
    flaky.gate.set()
    sink.flush()
    assert flaky.received == ids(make(5))
    sink.close()
    assert flaky.closed


def test_outage_is_retried_and_delivered_exactly_once(flaky: FlakySink) -> None:
    """While the destination is down samples wait; once it is back each arrives exactly once."""
    flaky.down = True
    sink = BufferedSink(flaky, retry=FAST, batch_size=4)
    samples = make(20)
    for i in range(0, 20, 3):
        sink.write(samples[i : i + 3])
    wait_until(lambda: sink.stats.failed_attempts > 1, "two failed attempts")
    assert not sink.force_flush(timeout=0.05)
    assert sink.pending == 20
    assert "destination down" in (sink.stats.last_error or "")
    flaky.down = False
    assert sink.force_flush(timeout=10)
    assert flaky.received == ids(samples)
    assert (sink.stats.accepted, sink.stats.exported, sink.pending) == (20, 20, 0)
    sink.close()


def test_the_bound_spills_to_disk_and_replays_in_order(flaky: FlakySink, tmp_path: Path) -> None:
    """Past the memory bound samples go to the spill log (memory stays bounded); after recovery
    everything is delivered once, in acceptance order, and the spill log is removed."""
    flaky.down = True
    sink = BufferedSink(
        flaky, max_buffer_samples=10, spill_dir=tmp_path / "spill", retry=FAST, batch_size=4
    )
    samples = make(50)
    for sample in samples:
        sink.write([sample])
        assert sink.stats.buffered <= 10 + 4  # memory plus one batch in flight
    assert sink.stats.spilled >= 36 and sink.stats.spill_pending == sink.stats.spilled
    flaky.down = False
    sink.flush(timeout=10)
    assert flaky.received == ids(samples)
    assert sink.stats.replayed == sink.stats.spilled and sink.stats.spill_pending == 0
    sink.write(make(2, start=50))  # back to memory once the spill log is drained
    sink.close()
    assert flaky.received == ids(make(52))
    assert not list((tmp_path / "spill").rglob("*.spill"))


def test_without_spill_dir_a_full_buffer_applies_backpressure(flaky: FlakySink) -> None:
    """With no spill log, write blocks while the buffer is full and resumes when there is room."""
    flaky.down = True
    sink = BufferedSink(flaky, max_buffer_samples=4, retry=FAST, batch_size=2, linger=0)
    sink.write(make(6))  # accepted: the buffer was empty
    done = threading.Event()

    def producer() -> None:
        sink.write(make(3, start=6))
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    assert not done.wait(0.3)  # blocked: buffer full, destination down
    flaky.down = False
    assert done.wait(10)
    thread.join()
    sink.close()
    assert flaky.received == ids(make(9))
    assert sink.stats.blocked_writes == 1 and sink.stats.blocked_seconds > 0


def test_block_timeout_raises_instead_of_waiting_forever(flaky: FlakySink) -> None:
    """With block_timeout a write that cannot get room raises a retryable SinkError."""
    flaky.down = True
    sink = BufferedSink(flaky, max_buffer_samples=2, retry=FAST, block_timeout=0.2, batch_size=1)
    sink.write(make(3))
    with pytest.raises(SinkError, match="buffer full") as caught:
        sink.write(make(2, start=3))
    assert caught.value.retryable
    flaky.down = False
    sink.close()
    assert flaky.received == ids(make(3))


def test_refused_batches_are_kept_and_counted(flaky: FlakySink, tmp_path: Path) -> None:
    """A batch the destination refuses for good is not retried forever, not dropped silently:
    it is counted, kept in rejected_samples and in the rejected log; the rest flows on."""
    flaky.refuse = {"ep0/1"}
    sink = BufferedSink(flaky, spill_dir=tmp_path, batch_size=2, linger=0.05, retry=FAST)
    sink.write(make(4))
    sink.flush(timeout=10)
    sink.close()
    assert flaky.received == ["ep0/2", "ep0/3"]
    assert sink.stats.rejected == 2 and ids(sink.rejected_samples) == ["ep0/0", "ep0/1"]
    assert len(list((tmp_path / "rejected").rglob("*.spill"))) == 1


def test_a_rejected_log_that_fails_never_stops_delivery(
    flaky: FlakySink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording a refused batch on disk can fail in any way (it once raised TypeError for numpy
    metadata and ended the delivery thread, so nothing after it was delivered): the batch stays
    in rejected_samples, and the samples behind it are delivered."""
    from tito_agents.sinks import spill

    def broken(self: object, batch: object) -> None:
        raise RuntimeError("the rejected log cannot be written")

    monkeypatch.setattr(spill.SpillLog, "append", broken)
    flaky.refuse = {"ep0/1"}
    sink = BufferedSink(flaky, spill_dir=tmp_path, batch_size=2, linger=0.05, retry=FAST)
    sink.write(make(2))
    sink.flush(timeout=10)
    sink.write(make(2, start=2))
    sink.flush(timeout=10)
    sink.close()
    assert flaky.received == ["ep0/2", "ep0/3"]
    assert sink.stats.rejected == 2 and ids(sink.rejected_samples) == ["ep0/0", "ep0/1"]


def test_flush_with_timeout_keeps_samples_queued(flaky: FlakySink) -> None:
    """A flush that runs out of time raises a retryable error; the samples are still delivered."""
    flaky.down = True
    sink = BufferedSink(flaky, retry=FAST)
    sink.write(make(3))
    with pytest.raises(SinkError, match="not delivered") as caught:
        sink.flush(timeout=0.1)
    assert caught.value.retryable and sink.pending == 3
    flaky.down = False
    sink.flush(timeout=10)
    assert flaky.received == ids(make(3))
    sink.close()


def test_close_spills_what_it_cannot_deliver_and_the_next_sink_delivers_it(
    flaky: FlakySink, tmp_path: Path
) -> None:
    """close() with the destination down spills the rest; a later BufferedSink on the same
    spill_dir delivers it exactly once."""
    flaky.down = True
    sink = BufferedSink(flaky, spill_dir=tmp_path, retry=FAST, batch_size=3)
    sink.write(make(10))
    sink.close(timeout=0.2)
    sink.close()  # idempotent
    assert flaky.received == [] and sink.stats.spill_pending == 10
    with pytest.raises(SinkError, match="closed"):
        sink.write(make(1))
    again = FlakySink()
    again.gate.clear()  # holds the replay, which starts at once, until the count is checked
    later = BufferedSink(again, spill_dir=tmp_path, retry=FAST)
    assert later.stats.spill_pending == 10
    again.gate.set()
    later.flush(timeout=10)
    later.close()
    assert again.received == ids(make(10)) and later.stats.replayed == 10


def test_close_without_spill_dir_reports_what_was_not_delivered(flaky: FlakySink) -> None:
    """Without a spill log, undelivered samples at close are an error that counts them."""
    flaky.down = True
    sink = BufferedSink(flaky, retry=FAST, batch_size=2)
    sink.write(make(5))
    with pytest.raises(SinkError, match="5 samples not delivered"):
        sink.close(timeout=0.1)


async def test_async_twins_do_not_block_the_loop(flaky: FlakySink) -> None:
    """awrite returns at once and aflush/aclose drain without blocking the event loop."""
    flaky.gate.clear()  # opened by the event loop once it has run 5 ticks during the flush
    sink = BufferedSink(flaky, batch_size=2, linger=0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1
            if ticks == 5:
                flaky.gate.set()

    task = asyncio.create_task(ticker())
    for i in range(6):
        await sink.awrite(make(1, start=i))
    await sink.aflush()
    await sink.aclose()
    task.cancel()
    assert flaky.received == ids(make(6))
    assert ticks >= 5


_EXIT_WITHOUT_CLOSE = textwrap.dedent(
    """
    import sys
    from tito_agents.sinks.buffered import BufferedSink
    from tito_agents.sinks.jsonl import JsonlSink
    from tito_agents.sinks.harness import synthetic_sample
    sink = BufferedSink(JsonlSink(sys.argv[1]), linger=60.0, batch_size=1000)
    sink.write([synthetic_sample(100, 16)])
    sink.flush()  # a delivery just now: the next write lingers (60 s) and is pending at exit
    sink.write([synthetic_sample(i, 16) for i in range(7)])
    print("exiting without close", flush=True)
    """
)


def test_exit_without_close_warns_and_drains(tmp_path: Path) -> None:
    """A program that exits without close() gets a warning, and its samples are delivered."""
    path = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WITHOUT_CLOSE, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "UnclosedSinkWarning" in done.stderr and "was not closed" in done.stderr
    assert "delivered 7 of 7 pending samples" in done.stderr
    assert len(path.read_text().splitlines()) == 8


_EXIT_NESTED = textwrap.dedent(
    """
    import sys
    from tito_agents.sinks.buffered import BufferedSink
    from tito_agents.sinks.files import RotatingFileSink
    from tito_agents.sinks.harness import synthetic_sample
    files = RotatingFileSink(sys.argv[1])
    sink = BufferedSink(files, linger=60.0, batch_size=1000)
    sink.write([synthetic_sample(100, 16)])
    sink.flush()  # a delivery just now: the next write lingers (60 s) and is pending at exit
    sink.write([synthetic_sample(i, 16) for i in range(9)])
    """
)


def test_exit_without_close_drains_a_buffer_into_a_file_sink(tmp_path: Path) -> None:
    """At exit the buffer is drained into its file sink before that sink's part is finalized,
    so every sample ends up in a finished part."""
    path = tmp_path / "out.parquet"
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_NESTED, str(path)], capture_output=True, text=True, check=True
    )
    assert "BufferedSink(RotatingFileSink) was not closed" in done.stderr
    assert "RotatingFileSink('" not in done.stderr  # closed by its wrapper, not on its own
    assert "delivered 9 of 9 pending samples" in done.stderr
    assert len(list(read_samples(path))) == 10


_CRASH_WHILE_DOWN = textwrap.dedent(
    """
    import os, sys
    from tito_agents.errors import SinkError
    from tito_agents.sinks.base import Sink
    from tito_agents.sinks.buffered import BufferedSink, Backoff
    from tito_agents.sinks.harness import synthetic_sample

    class Down(Sink):
        def write(self, samples):
            raise SinkError("down", retryable=True)

    sink = BufferedSink(Down(), spill_dir=sys.argv[1], max_buffer_samples=5, batch_size=5,
                        retry=Backoff(initial=0.01, maximum=0.05))
    for i in range(30):
        sink.write([synthetic_sample(i, 16)])
    print(sink.stats.spilled, flush=True)
    os._exit(9)
    """
)


def test_spilled_samples_survive_a_crash(tmp_path: Path, flaky: FlakySink) -> None:
    """Samples that reached the spill log before a hard crash are delivered by the next process
    (what was still only in memory is what a hard crash can lose)."""
    done = subprocess.run(
        [sys.executable, "-c", _CRASH_WHILE_DOWN, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 9
    spilled = int(done.stdout.strip())
    assert spilled >= 20
    sink = BufferedSink(flaky, spill_dir=tmp_path, retry=FAST)
    sink.flush(timeout=10)
    sink.close()
    assert len(flaky.received) == spilled == len(set(flaky.received))
    assert flaky.received == [f"ep{i // 4}/{i}" for i in range(30 - spilled, 30)]


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs root and mount; skipped otherwise)."""
    mount = shutil.which("mount")
    folder = tmp_path / "tiny"
    folder.mkdir()
    if os.geteuid() != 0 or mount is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    result = subprocess.run(
        [mount, "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(folder)], check=False)  # files still open


@pytest.mark.parametrize("name", ["s.arrow", "s.parquet"])
def test_disk_full_then_freed_delivers_everything_once(
    tiny_disk: Path, tmp_path: Path, name: str
) -> None:
    """On a real full disk the file sink fails (writing, or finalizing a Parquet part), the
    buffer retries and spills elsewhere; once space is freed every sample is in the files exactly
    once, and no file holds half a sample."""
    inner = RotatingFileSink(tiny_disk / name, max_file_samples=20)
    sink = BufferedSink(
        inner, spill_dir=tmp_path / "spill", max_buffer_samples=6, batch_size=3, retry=FAST
    )
    samples = make(120, tokens=3000)  # ~27 KB each: 3.2 MB in all, more than the disk holds

    def disk_was_full() -> bool:
        return sink.stats.failed_attempts > 0 or inner.stats.unfinalized_parts > 0

    for i in range(0, 120, 2):
        sink.write(samples[i : i + 2])
    deadline = time.monotonic() + 20
    while not disk_was_full() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert disk_was_full()
    if sink.stats.failed_attempts:
        assert "No space left" in (sink.stats.last_error or "")
        assert sink.stats.spilled > 0
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)
    sink.flush(timeout=30)
    sink.close()
    assert inner.stats.unfinalized_parts == 0
    back = [s.sample_id for s in read_samples(tiny_disk / name)]
    assert back == ids(samples)
    assert not [p for p in tiny_disk.iterdir() if p.name.startswith(".")]


def test_a_forked_child_gets_its_own_worker(tmp_path: Path) -> None:
    """After fork the child exports through its own worker; nothing is delivered twice."""
    from tito_agents.sinks.jsonl import JsonlSink
    from tito_agents.sinks.reading import read_samples

    path = tmp_path / "out.jsonl"
    sink = BufferedSink(JsonlSink(path), spill_dir=tmp_path / "spill", linger=0)
    sink.write(make(5))
    sink.flush()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            sink.write(make(3, start=5))
            sink.close()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    sink.write(make(2, start=8))
    sink.close()
    got = sorted(s.sample_id for s in read_samples(path))
    assert got == sorted(ids(make(10)))
    assert sink.stats.exported == 7


def test_write_nowait_refuses_at_once_where_write_would_wait(flaky: FlakySink) -> None:
    """write_nowait never waits: with the buffer full and no spill log it raises a retryable
    SinkError at once and accepts nothing (the caller keeps the samples); with room it accepts
    like write, and everything accepted is delivered once, in order."""
    flaky.down = True
    sink = BufferedSink(flaky, max_buffer_samples=4, retry=FAST, batch_size=2, linger=0)
    sink.write_nowait(make(6))  # accepted: the buffer was empty
    with pytest.raises(SinkError, match="not accepted") as caught:  # (write would wait forever)
        sink.write_nowait(make(3, start=6))
    assert caught.value.retryable
    assert (sink.stats.accepted, sink.stats.refused_writes, sink.stats.blocked_writes) == (6, 1, 0)
    flaky.down = False
    sink.flush(timeout=10)
    sink.write_nowait(make(3, start=6))  # room again
    sink.write_nowait([])
    sink.close()
    assert flaky.received == ids(make(9))


def test_write_nowait_spills_instead_of_refusing(flaky: FlakySink, tmp_path: Path) -> None:
    """With a spill log, a full buffer is no reason to refuse: write_nowait spills like write."""
    flaky.down = True
    sink = BufferedSink(
        flaky, max_buffer_samples=4, retry=FAST, batch_size=2, linger=0, spill_dir=tmp_path
    )
    for i in range(0, 12, 3):
        sink.write_nowait(make(3, start=i))
    assert sink.stats.spilled >= 6 and sink.stats.refused_writes == 0
    flaky.down = False
    sink.close(timeout=10)
    assert flaky.received == ids(make(12))


def test_an_outage_moves_memory_to_disk_within_spill_after(
    flaky: FlakySink, tmp_path: Path
) -> None:
    """Far below the memory bound, spill_after seconds after the first failed delivery the
    samples waiting in memory and the batch being retried are on disk (the worker wakes for it,
    not at its next retry), and later samples go straight there, awrite included; after the
    outage everything arrives once, in acceptance order."""
    flaky.down = True
    sink = BufferedSink(
        flaky,
        spill_dir=tmp_path,
        spill_after=0.2,
        batch_size=4,
        linger=0,
        retry=Backoff(initial=5.0, maximum=5.0, jitter=0),  # the next retry is far off
    )
    for i in range(0, 20, 5):
        sink.write(make(5, start=i))
    wait_until(lambda: (sink.stats.spilled, sink.stats.buffered) == (20, 0), "all on disk")
    assert sink.stats.failed_attempts == 1  # no retry yet: the window, not the backoff, spilled
    assert (sink.stats.spilled, sink.stats.spill_pending, sink.stats.buffered) == (20, 20, 0)
    sink.write(make(3, start=20))
    asyncio.run(sink.awrite(make(2, start=23)))
    assert (sink.stats.spilled, sink.stats.buffered) == (25, 0)
    flaky.down = False
    sink.flush(timeout=30)
    assert flaky.received == ids(make(25))
    assert sink.stats.replayed == 25 and sink.stats.spill_pending == 0
    sink.write(make(2, start=25))  # healthy again: memory, not disk
    sink.close()
    assert flaky.received == ids(make(27)) and sink.stats.spilled == 25


_KILLED_MID_OUTAGE = textwrap.dedent(
    """
    import os, sys, time
    from tito_agents.errors import SinkError
    from tito_agents.sinks.base import Sink
    from tito_agents.sinks.buffered import BufferedSink, Backoff
    from tito_agents.sinks.harness import synthetic_sample

    class Down(Sink):
        def write(self, samples):
            raise SinkError("down", retryable=True)

    sink = BufferedSink(Down(), spill_dir=sys.argv[1], max_buffer_samples=int(sys.argv[2]),
                        batch_size=4, spill_after=0.2, retry=Backoff(initial=0.01, maximum=0.05))
    for i in range(30):
        sink.write([synthetic_sample(i, 16)])
    deadline = time.monotonic() + 60
    while sink.stats.spilled < 30 and time.monotonic() < deadline:
        time.sleep(0.005)  # past the window: everything accepted is on disk
    for i in range(30, 40):
        sink.write([synthetic_sample(i, 16)])
    print(sink.stats.spilled, flush=True)
    os._exit(9)  # SIGKILL-like: no close, no atexit
    """
)


@pytest.mark.parametrize("bound", [4096, 6])
def test_a_producer_killed_mid_outage_loses_nothing_past_the_window(
    tmp_path: Path, flaky: FlakySink, bound: int
) -> None:
    """A producer killed during an outage, past spill_after, had every accepted sample on disk
    (far below the memory bound, or after the bound had already spilled the newest ones); the
    next process delivers them all once, in acceptance order."""
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_OUTAGE, str(tmp_path), str(bound)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 9, done.stderr
    assert int(done.stdout.strip()) == 40
    sink = BufferedSink(flaky, spill_dir=tmp_path, retry=FAST)
    sink.flush(timeout=10)
    sink.close()
    assert flaky.received == [f"ep{i // 4}/{i}" for i in range(40)]


def test_spill_after_is_an_open_sink_option(tmp_path: Path) -> None:
    """spill_after can be set in the query string of a sink URL, like the other buffer options."""
    from tito_agents.sinks.registry import open_sink

    sink = open_sink(f"{tmp_path / 'out.jsonl'}?spill_after=0.25", buffered=True)
    assert isinstance(sink, BufferedSink) and sink.spill_after == 0.25
    sink.close()


def test_a_producer_ahead_of_a_healthy_destination_gives_the_worker_its_turn(
    flaky: FlakySink,
) -> None:
    """With pace_after samples waiting for a healthy but busy destination, write waits (without
    the GIL) for the worker to take them, at most a short while; write_nowait never does."""
    flaky.gate.clear()  # the destination is busy with sample 0 until the test opens it
    sink = BufferedSink(flaky, pace_after=3, batch_size=2, linger=0)
    sink.write(make(1))
    wait_until(lambda: flaky.attempts == 1, "the worker inside inner.write with sample 0")
    sink.write(make(2, start=1))
    assert sink.stats.paced_writes == 0  # 2 waiting: not behind yet
    started = time.monotonic()
    sink.write(make(1, start=3))  # 3 waiting: the worker is behind
    waited = time.monotonic() - started
    assert sink.stats.paced_writes == 1 and waited >= 0.05  # waited its turn, then gave up
    sink.write_nowait(make(2, start=4))
    assert sink.stats.paced_writes == 1
    flaky.gate.set()
    sink.close()
    assert flaky.received == ids(make(6))


class RecordingSink(Sink):
    """Keeps each `write` call's sample ids and when it came."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, list[str]]] = []

    def write(self, samples: Sequence[Sample]) -> None:
        self.writes.append((time.monotonic(), ids(samples)))


def test_linger_batches_a_busy_writer_and_never_delays_a_lone_write() -> None:
    """A write after a quiet spell is delivered at once (no timed wait); writes that follow a
    delivery closely wait up to `linger` for each other and reach the destination together.

    The linger is an hour: a lone write held for it would never arrive, and `wait_until`'s hang
    guard turns that into a failure; no outcome depends on how fast the machine is."""
    inner = RecordingSink()
    sink = BufferedSink(inner, linger=3600.0, batch_size=100)
    sink.write(make(1))
    wait_until(lambda: len(inner.writes) == 1, "the lone write delivered, without a flush")
    for i in range(5):  # a busy writer, right after a delivery: lingers (close ends it)
        sink.write(make(1, start=1 + i))
    sink.close()
    assert [w for _, w in inner.writes] == [ids(make(1)), ids(make(5, start=1))]


def test_a_full_batch_ends_the_linger() -> None:
    """Lingering waits for a batch to fill: once `batch_size` samples wait, they go at once (the
    linger is an hour: only a full batch can end it before the hang guard)."""
    inner = RecordingSink()
    sink = BufferedSink(inner, linger=3600.0, batch_size=4)
    sink.write(make(1))
    sink.flush()
    for i in range(4):
        sink.write(make(1, start=1 + i))
    wait_until(lambda: len(inner.writes) >= 2, "the full batch delivered, without a flush")
    assert inner.writes[1][1] == ids(make(4, start=1))
    sink.close()


def test_a_buffered_sink_counts_in_delivery_stats() -> None:
    from tito_agents.config import DeliveryStats

    sink = BufferedSink(FlakySink())
    assert type(sink.stats) is DeliveryStats
    sink.close()
