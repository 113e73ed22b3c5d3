"""The fault-tolerant exporter: a bounded buffer in front of any sink, drained by one worker thread.

`BufferedSink(inner)` separates the hot path from I/O (OpenTelemetry's processor/exporter split):
`write` only enqueues; a worker thread hands batches to `inner`, retrying failures with exponential
backoff and jitter. Unlike a telemetry exporter it never drops a sample:

* while the destination is down, samples wait in memory, but only for `spill_after` seconds
  (default 1) from the first failed delivery: then what waits in memory (and the batch being
  retried) moves to a local append-only log (`spill_dir`), and every later sample goes there
  until the log is delivered, so a producer killed mid-outage loses at most that window, not a
  buffer's worth;
* at the memory bound (`max_buffer_samples` / `max_buffer_bytes`) samples spill too, or, without
  a spill log, `write` blocks until there is room (backpressure);
* when the destination is back, the worker delivers memory first, then the spill log, in the order
  the samples were accepted (memory spilled late goes to the front of the log:
  `SpillLog.prepend`); a crash leaves the spill log on disk and the next `BufferedSink` on the
  same `spill_dir` delivers it;
* a batch the destination refuses for good (`SinkError(retryable=False)`) goes to
  ``<spill_dir>/rejected/`` (and `rejected_samples`), is counted and logged, never retried forever.

A retried batch may reach the destination twice (it was stored but the reply was lost); readers
remove duplicates by `sample_id`, so what they see is exactly once.

The worker shares the GIL with the producer. A producer whose event loop never waits (CPU-bound
episodes) starves it: after every blocking call (a reply from the destination, a wait for work)
the worker gets the GIL back only after a switch interval, and it falls behind by seconds while
the buffer fills (measured: benchmarks/bench_delivery.py). So each `inner.write` takes everything
waiting (up to `batch_size` samples and `batch_bytes`), and once `pace_after` samples wait in memory
for a healthy destination, `write` / `awrite` give the worker its turn: they wait, without the
GIL, until it has taken them (at most `_PACE_TIMEOUT` per call). The producer then runs at the
speed export allows instead of piling up lag. `write_nowait` never paces.

Threading: every method may be called from any thread; `inner` is only ever called from the worker
thread. Blocking: `write` returns at once unless the buffer is full and no spill log is configured
(or the spill append fails), or it paces (above); `write_nowait` never waits: it raises a retryable
`SinkError` where `write` would wait for room, and never paces. `flush` and `close` block until
delivery (see their docstrings).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import lifecycle
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import sample_nbytes
from tito_agents.sinks.spill import SpillBatch, SpillLog
from tito_agents.stats import ExportStats

logger = logging.getLogger("tito_agents.sinks")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: attempt k waits about `initial * multiplier**k`, capped.

    The actual delay is drawn uniformly from [delay * (1 - jitter), delay], so many producers that
    failed together do not retry together.
    """

    initial: float = 0.05
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def delay(self, attempt: int) -> float:
        base = min(self.maximum, self.initial * self.multiplier ** min(attempt, 60))
        return base * (1.0 - self.jitter * random.random())


_PACE_TIMEOUT = 0.1
"""The longest one `write` waits for the worker to catch up (a slow destination is not paced
beyond it: memory grows, then spills at the bound)."""

_instances: weakref.WeakSet[BufferedSink] = weakref.WeakSet()


def _reset_all_after_fork() -> None:
    for sink in list(_instances):
        sink._reset_after_fork()


os.register_at_fork(after_in_child=_reset_all_after_fork)


def _is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, SinkError):
        return exc.retryable
    return isinstance(exc, OSError | ConnectionError | TimeoutError)


class BufferedSink(Sink):
    """A bounded, retrying, spilling buffer in front of `inner` (see the module docstring).

    inner: the destination sink; called from the worker thread only, and closed by `close`.
    max_buffer_samples / max_buffer_bytes: the memory bound (a batch larger than the bound is still
        accepted when the buffer is empty).
    batch_size / batch_bytes: the most samples / array bytes per `inner.write` call (at least one
        sample); the worker takes everything waiting up to these. linger: while writes come
        more often than this (seconds), the worker waits this long for a batch to fill before
        sending a smaller one; a write after a quiet spell goes at once (a timed wait is a second
        thread wake-up, which costs more CPU than a small write).
    spill_dir: where to spill at the bound, when delivery has failed for `spill_after` seconds,
        and after a failed close; None means backpressure instead (`write` blocks; `block_timeout`
        seconds, then `SinkError(retryable=True)`).
    spill_after: seconds from the first failed delivery attempt after which samples stop waiting
        in memory and go to the spill log (the most a producer killed during an outage can lose;
        0: at the first failure). Ignored without `spill_dir`.
    pace_after: samples waiting in memory, destination healthy, at which `write` / `awrite` wait
        for the worker to take them (see the module docstring); None: never.
    close_timeout: default seconds `close` waits for delivery before spilling the rest.
    """

    def __init__(
        self,
        inner: Sink,
        *,
        max_buffer_samples: int = 4096,
        max_buffer_bytes: int = 512 * 1024 * 1024,
        batch_size: int = 1024,
        batch_bytes: int = 8 * 1024 * 1024,
        linger: float = 0.01,
        spill_dir: str | os.PathLike[str] | None = None,
        spill_after: float = 1.0,
        pace_after: int | None = 256,
        retry: RetryPolicy | None = None,
        block_timeout: float | None = None,
        close_timeout: float = 60.0,
        name: str | None = None,
    ) -> None:
        if max_buffer_samples < 1 or batch_size < 1 or batch_bytes < 1:
            raise ConfigurationError("max_buffer_samples, batch_size and batch_bytes must be >= 1")
        if pace_after is not None and pace_after < 1:
            raise ConfigurationError(f"pace_after must be >= 1 sample or None, not {pace_after}")
        if not spill_after >= 0:
            raise ConfigurationError(f"spill_after must be >= 0 seconds, not {spill_after}")
        self.inner = inner
        self.name = name or type(inner).__name__
        self.max_buffer_samples = max_buffer_samples
        self.max_buffer_bytes = max_buffer_bytes
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.spill_after = spill_after
        self.pace_after = pace_after
        self.retry = retry or RetryPolicy()
        self.block_timeout = block_timeout
        self.close_timeout = close_timeout
        self.stats = ExportStats()
        self.rejected_samples: list[Sample] = []
        """Samples the destination refused for good (also in ``<spill_dir>/rejected/``)."""
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        # Opened now so a spill log left by a crashed process is replayed at once.
        self._spill = SpillLog(self.spill_dir) if self.spill_dir is not None else None
        self._rejected_log: SpillLog | None = None
        self._cond = threading.Condition()
        self._memory: deque[Sample] = deque()
        self._memory_bytes = 0
        self._inflight = 0
        self._lingering = False
        """The worker waits for a batch to fill (a write must not wake it before it is full)."""
        self._delivered_at = float("-inf")
        """When the worker last finished a delivery (monotonic): lingering is for busy writers."""
        self._spilling = False
        self._failing_since: float | None = None  # first failed attempt since the last success
        self._failures = 0  # failed attempts since the last success: the backoff goes on
        self._retry_at = 0.0  # after a batch moved to the spill log, when to retry it
        self._done = 0  # samples delivered or rejected, in acceptance order
        self._flush_target = 0  # `_done` value a pending flush waits for
        self._flushed = 0  # highest target for which inner.flush() succeeded
        self._flush_error: BaseException | None = None
        self._closing = False
        self._closed = False
        self._abort = threading.Event()
        self._worker: threading.Thread | None = None
        if self._spill is not None:
            self.stats.spill_pending = self._spill.pending
            if self.stats.spill_pending:
                self._spilling = True
                self._start_worker()
        lifecycle.track(self)
        _instances.add(self)

    def __repr__(self) -> str:
        return f"BufferedSink({self.name})"

    def _spill_log(self) -> SpillLog | None:
        """The spill log, opened on first use in a forked child (see `_reset_after_fork`)."""
        if self._spill is None and self.spill_dir is not None:
            self._spill = SpillLog(self.spill_dir)
        return self._spill

    def _reset_after_fork(self) -> None:
        """In a forked child: the parent keeps delivering what it had accepted; the child starts
        with an empty buffer, its own counters, worker thread and (lazily) spill folder."""
        self._cond = threading.Condition()
        self._abort = threading.Event()
        self._worker = None
        self._memory = deque()
        self._memory_bytes = self._inflight = 0
        self._done = self._flush_target = self._flushed = 0
        self._spilling = False
        self._failing_since = None
        self._failures = 0
        self._retry_at = 0.0
        self._spill = None  # the parent's files stay the parent's
        self._rejected_log = None
        self.rejected_samples = []
        self.stats = ExportStats()
        self._closing = self._closed = False
        lifecycle.track(self)

    # ---- hot path ----

    def write(self, samples: Sequence[Sample]) -> None:
        """Accept samples for delivery; returns at once unless backpressure applies: no room and
        no spill log (waits, `block_timeout`), or the worker `pace_after` samples behind a healthy
        destination (waits for it to take them, at most `_PACE_TIMEOUT`)."""
        if not samples:
            return
        batch = list(samples)
        nbytes = sum(sample_nbytes(s) for s in batch)
        waited_since: float | None = None
        warn_after = 10.0
        with self._cond:
            self._check_open()
            self._start_worker()
            while True:
                if self._enqueue_locked(batch, nbytes):
                    break
                if waited_since is None:
                    waited_since = time.monotonic()
                    self.stats.blocked_writes += 1
                waited = time.monotonic() - waited_since
                if self.block_timeout is not None and waited >= self.block_timeout:
                    self.stats.blocked_seconds += waited
                    raise SinkError(
                        f"{self.name}: buffer full for {waited:.1f}s and nowhere to spill "
                        f"(last error: {self.stats.last_error})",
                        retryable=True,
                    )
                if waited >= warn_after:
                    warn_after += 30.0
                    logger.warning(
                        "%s: write has waited %.0fs for room (destination failing: %s)",
                        self.name,
                        waited,
                        self.stats.last_error,
                    )
                self._cond.wait(1.0)
                self._check_open()
            if waited_since is not None:
                self.stats.blocked_seconds += time.monotonic() - waited_since
            self._pace_locked()

    def _behind(self) -> bool:
        """The worker is `pace_after` samples behind a healthy destination."""
        return (
            self.pace_after is not None
            and len(self._memory) >= self.pace_after
            and self._failing_since is None
            and not self._spilling
            and not self._closing
        )

    def _pace_locked(self) -> None:
        """Give the worker its turn: wait, the GIL released, until it took what waits in memory
        (at most `_PACE_TIMEOUT`). Called with the lock."""
        if not self._behind():
            return
        started = time.monotonic()
        deadline = started + _PACE_TIMEOUT
        while self._behind():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
        self.stats.paced_writes += 1
        self.stats.paced_seconds += time.monotonic() - started

    def _pace(self) -> None:
        with self._cond:
            self._pace_locked()

    def write_nowait(self, samples: Sequence[Sample]) -> None:
        """Accept samples like `write`, but never wait for room.

        For callers that must not block (an HTTP transport, an event loop): where `write` would
        wait (buffer full and no spill log, or the spill append failed), this raises
        `SinkError(retryable=True)` at once and accepts nothing, so the caller still owns the
        samples and decides (retry later, `write`, or fail the episode); nothing is dropped
        silently. It may append to the spill log (a local, fsynced write), never waits for the
        destination.
        """
        if not samples:
            return
        batch = list(samples)
        nbytes = sum(sample_nbytes(s) for s in batch)
        with self._cond:
            self._check_open()
            self._start_worker()
            if self._enqueue_locked(batch, nbytes):
                return
            self.stats.refused_writes += 1
        raise SinkError(
            f"{self.name}: buffer full and nowhere to spill; {len(batch)} samples not accepted "
            f"(last error: {self.stats.last_error})",
            retryable=True,
        )

    async def awrite(self, samples: Sequence[Sample]) -> None:
        """`write` for coroutines: the event loop never waits.

        Samples that fit in memory are accepted inline; a spill append (disk I/O), a wait for
        room (backpressure, `block_timeout`) or pacing (`pace_after`) runs in a thread, with
        `write`'s semantics.
        """
        if not samples:
            return
        batch = list(samples)
        nbytes = sum(sample_nbytes(s) for s in batch)
        with self._cond:
            self._check_open()
            self._start_worker()
            accepted = self._enqueue_memory_if_room(batch, nbytes)
            behind = self._behind()
        if not accepted:
            await asyncio.to_thread(self.write, batch)
        elif behind:  # this coroutine waits; the others run on, until they wait too
            await asyncio.to_thread(self._pace)

    def _fits(self, count: int, nbytes: int) -> bool:
        if not self._memory:
            return True
        return (
            len(self._memory) + count <= self.max_buffer_samples
            and self._memory_bytes + nbytes <= self.max_buffer_bytes
        )

    def _enqueue_memory(self, batch: list[Sample], nbytes: int) -> None:
        self._memory.extend(batch)
        self._memory_bytes += nbytes
        self.stats.accepted += len(batch)
        self.stats.buffered = len(self._memory) + self._inflight
        if not self._lingering or len(self._memory) >= self.batch_size:
            self._cond.notify_all()

    def _enqueue_memory_if_room(self, batch: list[Sample], nbytes: int) -> bool:
        """Put `batch` in memory if memory is where it belongs now and there is room."""
        if self._spilling or self._spill_due() or not self._fits(len(batch), nbytes):
            return False
        self._enqueue_memory(batch, nbytes)
        return True

    def _spill_due(self) -> bool:
        """Delivery has been failing for `spill_after` seconds and there is a spill log: samples
        must not wait in memory any more."""
        return (
            self._failing_since is not None
            and self.spill_dir is not None
            and time.monotonic() - self._failing_since >= self.spill_after
        )

    def _enqueue_locked(self, batch: list[Sample], nbytes: int) -> bool:
        """Put `batch` in memory or the spill log; False when it must wait for room."""
        if self._enqueue_memory_if_room(batch, nbytes):
            return True
        if self._spill_due() and (self._memory or not self._spilling):
            self._spill_memory_locked([])  # what waits in memory goes first, keeping the order
        if not self._spilling and self._fits(len(batch), nbytes):
            self._enqueue_memory(batch, nbytes)  # the spill log refused: memory, as before
            return True
        spill = self._spill_log()
        if spill is None:
            return False
        try:
            spill.append(batch)
        except SinkError as exc:
            return self._spill_refused(exc, "applying backpressure")
        if not self._spilling:
            logger.warning(
                "%s: buffer full (%d samples); spilling to %s until the destination catches up",
                self.name,
                len(self._memory),
                spill.folder,
            )
        self._spilling = True
        self.stats.accepted += len(batch)
        self.stats.spilled += len(batch)
        self.stats.spill_pending = spill.pending
        self._cond.notify_all()
        return True

    def _spill_refused(self, exc: SinkError, outcome: str) -> bool:
        """Count and log a spill the disk refused; False, for the caller to return."""
        self.stats.spill_failures += 1
        self.stats.last_error = str(exc)
        logger.error("%s: cannot spill, %s: %s", self.name, outcome, exc)
        return False

    def _spill_memory_locked(self, front: list[Sample]) -> bool:
        """Move `front` (the batch being retried) and everything waiting in memory to the front of
        the spill log, and send every later sample there: delivery has failed for `spill_after`
        seconds. False (nothing moved) if the spill log refuses; they stay in memory then."""
        spill = self._spill_log()
        if spill is None:
            return False
        moved = front + list(self._memory)
        try:
            spill.prepend(moved)
        except SinkError as exc:
            return self._spill_refused(exc, "samples stay in memory")
        if not self._spilling:
            logger.warning(
                "%s: delivery failing for %.1fs; %d waiting samples and every new one go to %s "
                "until the destination catches up",
                self.name,
                time.monotonic() - (self._failing_since or time.monotonic()),
                len(moved),
                spill.folder,
            )
        self._memory.clear()
        self._memory_bytes = 0
        self._spilling = True
        self.stats.spilled += len(moved)
        self.stats.spill_pending = spill.pending
        self.stats.buffered = self._inflight
        self._cond.notify_all()
        return True

    def _check_open(self) -> None:
        if self._closing:
            raise SinkError(f"{self.name} is closed", retryable=False)

    # ---- flush / close ----

    def force_flush(self, timeout: float | None = None) -> bool:
        """Deliver everything accepted so far and flush `inner`; True if that finished in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._closed:
                return self._done >= self.stats.accepted
            self._start_worker()
            target = self.stats.accepted
            self._flush_target = max(self._flush_target, target)
            self._cond.notify_all()
            while self._flushed < target or self._done < target:
                if self._flush_error is not None:
                    error, self._flush_error = self._flush_error, None
                    msg = f"{self.name}: flush failed: {error}"
                    raise SinkError(msg, retryable=False) from error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
            return True

    def flush(self, timeout: float | None = None) -> None:
        """Return once every sample accepted so far is delivered and `inner` is flushed.

        Blocks while the destination is down (the worker keeps retrying); with `timeout`, raises
        `SinkError(retryable=True)` when it runs out; the samples stay queued, nothing is lost.
        """
        if not self.force_flush(timeout):
            raise SinkError(
                f"{self.name}: {self.pending} samples not delivered after {timeout}s "
                f"(last error: {self.stats.last_error}); they stay queued",
                retryable=True,
            )

    @property
    def pending(self) -> int:
        """Samples accepted and neither delivered nor rejected yet."""
        with self._cond:
            return self.stats.accepted - self._done

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting, deliver everything (waiting up to `timeout`, default `close_timeout`),
        then close `inner`. Idempotent.

        What is not delivered in time is spilled to `spill_dir` (delivered by the next
        `BufferedSink` on that folder) and logged; without a spill log, `SinkError(retryable=True)`
        says how many samples were not delivered.
        """
        timeout = self.close_timeout if timeout is None else timeout
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
            worker = self._worker
        if worker is not None:
            worker.join(timeout)
            if worker.is_alive():
                self._abort.set()  # cut the backoff short; the worker hands its batch back
                with self._cond:
                    self._cond.notify_all()
                worker.join()
        leftover = self._save_leftover()
        try:
            self.inner.close()
        except Exception as exc:
            logger.error("%s: closing the destination failed: %s", self.name, exc)
            if not leftover:
                raise
        finally:
            if self._spill is not None:
                self._spill.close()
            if self._rejected_log is not None:
                self._rejected_log.close()
            self._closed = True
        if leftover:
            raise SinkError(leftover, retryable=True)

    def _save_leftover(self) -> str:
        """Spill what the worker could not deliver; the message for the caller, or ''."""
        with self._cond:
            left = list(self._memory)
            self._memory.clear()
            self._memory_bytes = 0
            self.stats.buffered = 0
        if not left:
            return ""
        spill = self._spill_log()
        if spill is not None:
            try:
                spill.prepend(left)  # older than anything spilled: replayed first
            except SinkError as exc:
                self.stats.spill_failures += 1
                return f"{self.name}: {len(left)} samples not delivered and not spilled: {exc}"
            self.stats.spilled += len(left)
            self.stats.spill_pending = spill.pending
            logger.warning(
                "%s: %d samples not delivered before close; spilled to %s "
                "(the next BufferedSink on %s delivers them)",
                self.name,
                len(left),
                spill.folder,
                self.spill_dir,
            )
            return ""
        return (
            f"{self.name}: {len(left)} samples not delivered before close and no spill_dir "
            f"(last error: {self.stats.last_error})"
        )

    def close_at_exit(self, timeout: float) -> str:
        before = self.pending
        exported, rejected = self.stats.exported, self.stats.rejected
        try:
            self.close(timeout)
        except SinkError as exc:
            return f"closed with {before} pending samples: {exc}"
        outcome = f"closed; delivered {self.stats.exported - exported} of {before} pending samples"
        if self.stats.rejected > rejected:
            outcome += f", {self.stats.rejected - rejected} refused (kept in rejected_samples)"
        if self.stats.spill_pending:
            outcome += f", {self.stats.spill_pending} wait in {self.spill_dir}"
        return outcome

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ---- worker ----

    def _start_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(
                target=self._run, name=f"tito-export-{self.name}", daemon=True
            )
            self._worker.start()

    def _next_batch(self) -> tuple[list[Sample], SpillBatch | None] | None:
        """Wait for work; None when closing and everything is delivered. Called with the lock."""
        lingered = False
        while True:
            if self._memory:
                if (
                    not lingered
                    and len(self._memory) < self.batch_size
                    and self.linger > 0
                    and not self._closing
                    and self._flush_target <= self._done
                    and time.monotonic() - self._delivered_at < self.linger
                ):
                    lingered = self._lingering = True
                    try:
                        self._cond.wait(self.linger)
                    finally:
                        self._lingering = False
                    continue  # memory may have moved to the spill log meanwhile
                batch = self._take_memory_locked()
                self._inflight = len(batch)
                self._cond.notify_all()  # paced writers: the worker took its turn
                return batch, None
            if self._spill is not None and self._spilling:
                spilled = self._spill.read_batch(self.batch_size, self.batch_bytes)
                if spilled is not None:
                    self._inflight = len(spilled.samples)
                    return spilled.samples, spilled
                self._spilling = False  # replayed to the end: back to memory
                self.stats.spill_pending = 0
                self._cond.notify_all()
                continue
            if self._flush_target > self._flushed and self._done >= self._flush_target:
                return [], None  # idle with a flush pending: flush the destination
            if self._closing or self._abort.is_set():
                return None
            self._cond.wait()

    def _take_memory_locked(self) -> list[Sample]:
        """Everything waiting, up to `batch_size` samples and `batch_bytes` (at least one)."""
        batch: list[Sample] = []
        nbytes = 0
        while self._memory and len(batch) < self.batch_size:
            size = sample_nbytes(self._memory[0])
            if batch and nbytes + size > self.batch_bytes:
                break
            batch.append(self._memory.popleft())
            nbytes += size
        self._memory_bytes -= nbytes
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                work = self._next_batch()
            if work is None:
                return
            batch, spilled = work
            if not batch:
                self._flush_inner()
                continue
            outcome = self._deliver(batch, spilled)
            if outcome == "aborted":
                self._hand_back(batch, spilled)
                return
            with self._cond:
                self._inflight = 0
                if outcome == "spilled":  # now at the front of the spill log
                    self.stats.buffered = len(self._memory)
                    continue
                self._failing_since = None
                self._failures = 0
                self._delivered_at = time.monotonic()
                self._done += len(batch)
                self.stats.exported += len(batch)
                if spilled is not None and self._spill is not None:
                    self._spill.commit(spilled)
                    self.stats.replayed += len(batch)
                    self.stats.spill_pending = self._spill.pending
                self.stats.buffered = len(self._memory)
                self._cond.notify_all()

    def _deliver(
        self, batch: list[Sample], spilled: SpillBatch | None
    ) -> Literal["delivered", "spilled", "aborted"]:
        """Hand `batch` to the destination, retrying: "delivered" (or rejected for good);
        "spilled" when a memory batch moved to the spill log because delivery has failed for
        `spill_after` seconds; "aborted" by `close`. The backoff carries over from batch to batch
        until a delivery succeeds."""
        wait = self._retry_at - time.monotonic()
        if wait > 0 and self._abort.wait(wait):  # the backoff a moved batch was serving
            return "aborted"
        while True:
            try:
                self.inner.write(batch)
                return "delivered"
            except Exception as exc:
                with self._cond:
                    self.stats.failed_attempts += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    if self._failing_since is None:
                        self._failing_since = time.monotonic()
                if not _is_retryable(exc):
                    self._reject(batch, exc)
                    return "delivered"
                attempt = self._failures
                self._failures += 1
                delay = self.retry.delay(attempt)
                if attempt == 0 or attempt % 20 == 0:
                    logger.warning(
                        "%s: delivery failed (%s); retrying with backoff, %d samples buffered",
                        self.name,
                        exc,
                        self.pending,
                    )
                retry_at = time.monotonic() + delay
                while True:
                    if spilled is None and self._spill_batch(batch):
                        self._retry_at = retry_at
                        return "spilled"
                    now = time.monotonic()
                    if now >= retry_at:
                        break
                    wait = retry_at - now
                    if spilled is None and self.spill_dir is not None:
                        with self._cond:  # wake when the window ends, not at the next retry
                            since = self._failing_since or now
                        wait = min(wait, max(0.0, since + self.spill_after - now) + 0.001)
                    if self._abort.wait(wait):
                        return "aborted"

    def _spill_batch(self, batch: list[Sample]) -> bool:
        """Once delivery has failed for `spill_after` seconds, move the batch being retried (and
        memory behind it) to the front of the spill log; True if it moved."""
        with self._cond:
            return self._spill_due() and self._spill_memory_locked(batch)

    def _flush_inner(self) -> None:
        with self._cond:
            target = self._flush_target
        attempt = 0
        while True:
            try:
                self.inner.flush()
                break
            except Exception as exc:
                if not _is_retryable(exc):
                    with self._cond:
                        self._flush_error = exc
                        self._flushed = target
                        self._cond.notify_all()
                    return
                with self._cond:
                    self.stats.failed_attempts += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                attempt += 1
                if self._abort.wait(self.retry.delay(attempt)):
                    return
        with self._cond:
            self._flushed = max(self._flushed, target)
            self._cond.notify_all()

    def _reject(self, batch: list[Sample], exc: BaseException) -> None:
        logger.error(
            "%s: destination refused %d samples for good (%s); kept in rejected_samples%s",
            self.name,
            len(batch),
            exc,
            f" and {self.spill_dir}/rejected" if self.spill_dir else "",
        )
        self.rejected_samples.extend(batch)
        if self.spill_dir is not None:
            try:
                if self._rejected_log is None:
                    self._rejected_log = SpillLog(self.spill_dir / "rejected")
                self._rejected_log.append(batch)
            except SinkError as spill_exc:
                logger.error("%s: cannot record rejected samples: %s", self.name, spill_exc)
        with self._cond:
            self.stats.rejected += len(batch)

    def _hand_back(self, batch: list[Sample], spilled: SpillBatch | None) -> None:
        """Return an undelivered in-flight batch so `close` can spill it (a spilled batch is
        still in its log, uncommitted)."""
        with self._cond:
            self._inflight = 0
            if spilled is None:
                self._memory.extendleft(reversed(batch))
                self._memory_bytes += sum(sample_nbytes(s) for s in batch)
            self._cond.notify_all()
