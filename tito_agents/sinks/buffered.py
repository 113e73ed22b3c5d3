"""The fault-tolerant exporter: a bounded buffer in front of any sink, drained by one worker thread.

`BufferedSink(inner)` separates the hot path from I/O (OpenTelemetry's processor/exporter split):
`write` only enqueues; a worker thread hands batches to `inner`, retrying failures with exponential
backoff and jitter. Unlike a telemetry exporter it never drops a sample:

* while the destination is down, samples wait in memory up to `max_buffer_samples` /
  `max_buffer_bytes`;
* at the bound they spill to a local append-only log (`spill_dir`), or, without one, `write` blocks
  until there is room (backpressure);
* when the destination is back, the worker delivers memory first, then the spill log, in the order
  the samples were accepted; a crash leaves the spill log on disk and the next `BufferedSink` on
  the same `spill_dir` delivers it;
* a batch the destination refuses for good (`SinkError(retryable=False)`) goes to
  ``<spill_dir>/rejected/`` (and `rejected_samples`), is counted and logged, never retried forever.

A retried batch may reach the destination twice (it was stored but the reply was lost); readers
remove duplicates by `sample_id`, so what they see is exactly once.

Threading: every method may be called from any thread; `inner` is only ever called from the worker
thread. Blocking: `write` returns at once unless the buffer is full and no spill log is configured
(or the spill append fails); `write_nowait` raises a retryable `SinkError` there instead of
waiting. `flush` and `close` block until delivery (see their docstrings).
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
from dataclasses import asdict, dataclass
from pathlib import Path

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import _lifecycle
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import sample_nbytes
from tito_agents.sinks.spill import SpillBatch, SpillLog

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


@dataclass(slots=True)
class ExportStats:
    """What a `BufferedSink` did (read them; the sink updates them)."""

    accepted: int = 0
    """Samples handed to `write`."""
    exported: int = 0
    """Samples the inner sink accepted (including replayed ones)."""
    buffered: int = 0
    """Samples in memory now (waiting or being delivered)."""
    spilled: int = 0
    """Samples written to the spill log."""
    replayed: int = 0
    """Samples delivered from the spill log (this process's or one left by a crashed process)."""
    spill_pending: int = 0
    """Samples in the spill log now."""
    failed_attempts: int = 0
    """Delivery attempts that raised (each was retried or rejected)."""
    rejected: int = 0
    """Samples refused for good by the destination (kept in the rejected log, never dropped)."""
    blocked_writes: int = 0
    """`write` calls that had to wait for room (backpressure)."""
    blocked_seconds: float = 0.0
    spill_failures: int = 0
    """Spill appends that failed (e.g. the spill disk is full too); those writes waited instead."""
    refused_writes: int = 0
    """`write_nowait` calls that found no room and raised (the caller kept the samples)."""
    last_error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


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
    batch_size: samples per `inner.write` call. linger: seconds the worker waits for a batch to fill
        before sending a smaller one.
    spill_dir: where to spill at the bound and after a failed close; None means backpressure
        instead (`write` blocks; `block_timeout` seconds, then `SinkError(retryable=True)`).
    close_timeout: default seconds `close` waits for delivery before spilling the rest.
    """

    def __init__(
        self,
        inner: Sink,
        *,
        max_buffer_samples: int = 4096,
        max_buffer_bytes: int = 512 * 1024 * 1024,
        batch_size: int = 64,
        linger: float = 0.01,
        spill_dir: str | os.PathLike[str] | None = None,
        retry: RetryPolicy | None = None,
        block_timeout: float | None = None,
        close_timeout: float = 60.0,
        name: str | None = None,
    ) -> None:
        if max_buffer_samples < 1 or batch_size < 1:
            raise ConfigurationError("max_buffer_samples and batch_size must be >= 1")
        self.inner = inner
        self.name = name or type(inner).__name__
        self.max_buffer_samples = max_buffer_samples
        self.max_buffer_bytes = max_buffer_bytes
        self.batch_size = batch_size
        self.linger = linger
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
        self._spilling = False
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
        _lifecycle.track(self)
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
        self._spill = None  # the parent's files stay the parent's
        self._rejected_log = None
        self.rejected_samples = []
        self.stats = ExportStats()
        self._closing = self._closed = False
        _lifecycle.track(self)

    # ---- hot path ----

    def write(self, samples: Sequence[Sample]) -> None:
        """Accept samples for delivery; returns at once unless backpressure applies."""
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

        Samples that fit in memory are accepted inline; a spill append (disk I/O) or a wait for
        room (backpressure, `block_timeout`) runs in a thread, with `write`'s semantics.
        """
        if not samples:
            return
        batch = list(samples)
        nbytes = sum(sample_nbytes(s) for s in batch)
        with self._cond:
            self._check_open()
            self._start_worker()
            if self._enqueue_memory_if_room(batch, nbytes):
                return
        await asyncio.to_thread(self.write, batch)

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
        self._cond.notify_all()

    def _enqueue_memory_if_room(self, batch: list[Sample], nbytes: int) -> bool:
        """Put `batch` in memory if memory is where it belongs now and there is room."""
        if not self._spilling and self._fits(len(batch), nbytes):
            self._enqueue_memory(batch, nbytes)
            return True
        return False

    def _enqueue_locked(self, batch: list[Sample], nbytes: int) -> bool:
        """Put `batch` in memory or the spill log; False when it must wait for room."""
        if self._enqueue_memory_if_room(batch, nbytes):
            return True
        spill = self._spill_log()
        if spill is None:
            return False
        try:
            spill.append(batch)
        except SinkError as exc:
            self.stats.spill_failures += 1
            self.stats.last_error = str(exc)
            logger.error("%s: cannot spill, applying backpressure: %s", self.name, exc)
            return False
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
                spill.append(left)
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
        while True:
            if self._memory:
                if (
                    len(self._memory) < self.batch_size
                    and self.linger > 0
                    and not self._closing
                    and self._flush_target <= self._done
                ):
                    self._cond.wait(self.linger)
                count = min(self.batch_size, len(self._memory))
                batch = [self._memory.popleft() for _ in range(count)]
                self._memory_bytes -= sum(sample_nbytes(s) for s in batch)
                self._inflight = count
                return batch, None
            if self._spill is not None and self._spilling:
                spilled = self._spill.read_batch(self.batch_size)
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
            if not self._deliver(batch):
                self._hand_back(batch, spilled)
                return
            with self._cond:
                self._inflight = 0
                self._done += len(batch)
                self.stats.exported += len(batch)
                if spilled is not None and self._spill is not None:
                    self._spill.commit(spilled)
                    self.stats.replayed += len(batch)
                    self.stats.spill_pending = self._spill.pending
                self.stats.buffered = len(self._memory)
                self._cond.notify_all()

    def _deliver(self, batch: list[Sample]) -> bool:
        """Hand `batch` to the destination, retrying; False if aborted by `close`."""
        attempt = 0
        while True:
            try:
                self.inner.write(batch)
                return True
            except Exception as exc:
                with self._cond:
                    self.stats.failed_attempts += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                if not _is_retryable(exc):
                    self._reject(batch, exc)
                    return True
                delay = self.retry.delay(attempt)
                if attempt == 0 or attempt % 20 == 0:
                    logger.warning(
                        "%s: delivery failed (%s); retrying with backoff, %d samples buffered",
                        self.name,
                        exc,
                        self.pending,
                    )
                attempt += 1
                if self._abort.wait(delay):
                    return False

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
