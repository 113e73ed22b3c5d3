"""Fault-tolerant delivery: a bounded buffer in front of any sink, drained by one delivery thread.

In OpenTelemetry's terms the collector's `export.SampleProcessor` enqueues and a sink exports;
`BufferedSink(inner)` is the queue between them that keeps the hot path off I/O: `write` only
enqueues; its ``tito-delivery-<name>`` thread (`_worker.Worker`) hands batches to `inner`,
retrying failures with exponential backoff and jitter (`policy.Backoff`). Unlike a telemetry
exporter it never drops a sample:

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
GIL, until it has taken them (at most `PACE_TIMEOUT` per call). The producer then runs at the
speed delivery allows instead of piling up lag. `write_nowait` never paces.

Threading: every method may be called from any thread; `inner` is only ever called from the
delivery thread. The sink is the producer's side (accept, pace, block, flush, close); the queue
and its thread (deliver, retry, reject, spill) are a `sinks._delivery.Delivery` it holds.

Blocking: `write` returns at once unless the buffer is full and no spill log is configured (or the
spill append fails), or it paces (above); `write_nowait` never waits: it raises a retryable
`SinkError` where `write` would wait for room, and never paces. `flush` and `close` block until
delivery (see their docstrings).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from tito_agents.config import DeliveryStats
from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import lifecycle
from tito_agents.sinks._delivery import Delivery
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import sample_nbytes
from tito_agents.sinks.retry import PACE_TIMEOUT, Backoff, check_buffer_options

__all__ = ["Backoff", "BufferedSink"]

logger = logging.getLogger("tito_agents.sinks")


class BufferedSink(Sink):
    """A bounded, retrying, spilling buffer in front of `inner` (see the module docstring).

    inner: the destination sink; called from the delivery thread only, and closed by `close`.
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
        retry: Backoff | None = None,
        block_timeout: float | None = None,
        close_timeout: float = 60.0,
        name: str | None = None,
    ) -> None:
        check_buffer_options(
            max_buffer_samples=max_buffer_samples,
            batch_size=batch_size,
            batch_bytes=batch_bytes,
            spill_after=spill_after,
            pace_after=pace_after,
        )
        self.inner = inner
        self.name = name or type(inner).__name__
        self.max_buffer_samples = max_buffer_samples
        self.max_buffer_bytes = max_buffer_bytes
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.spill_after = spill_after
        self.pace_after = pace_after
        self.retry = retry or Backoff()
        self.block_timeout = block_timeout
        self.close_timeout = close_timeout
        self.stats = DeliveryStats()
        self.rejected_samples: list[Sample] = []
        """Samples the destination refused for good (also in ``<spill_dir>/rejected/``)."""
        self.spill_dir = Path(spill_dir).expanduser() if spill_dir is not None else None
        self._closed = False
        self._delivery = Delivery(self, after_fork=self._reset_after_fork)
        lifecycle.track(self)

    def __repr__(self) -> str:
        return f"BufferedSink({self.name})"

    def _reset_after_fork(self) -> None:
        """In a forked child (the delivery has an empty queue, a new lock and no thread): the
        parent keeps delivering what it had accepted; the child starts with its own counters."""
        self.rejected_samples = []
        self.stats = DeliveryStats()
        self._closed = False
        lifecycle.track(self)

    @property
    def pending(self) -> int:
        """Samples accepted and neither delivered nor rejected yet."""
        with self._delivery.cond:
            return self._delivery.unfinished()

    # ---- hot path ----

    def write(self, samples: Sequence[Sample]) -> None:
        """Accept samples for delivery; returns at once unless backpressure applies: no room and
        no spill log (waits, `block_timeout`), or the worker `pace_after` samples behind a healthy
        destination (waits for it to take them, at most `PACE_TIMEOUT`)."""
        if not samples:
            return
        batch = list(samples)
        nbytes = sum(sample_nbytes(s) for s in batch)
        waited_since: float | None = None
        warn_after = 10.0
        delivery = self._delivery
        with delivery.cond:
            self._check_open()
            delivery.start()
            while True:
                if delivery.accept(batch, nbytes):
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
                delivery.cond.wait(1.0)
                self._check_open()
            if waited_since is not None:
                self.stats.blocked_seconds += time.monotonic() - waited_since
            self._pace_locked()

    def _behind(self) -> bool:
        """The worker is `pace_after` samples behind a healthy destination."""
        return self._delivery.behind(self.pace_after)

    def _pace_locked(self) -> None:
        """Give the worker its turn: wait, the GIL released, until it took what waits in memory
        (at most `PACE_TIMEOUT`). Called with the lock."""
        if not self._behind():
            return
        started = time.monotonic()
        deadline = started + PACE_TIMEOUT
        while self._behind():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._delivery.cond.wait(remaining)
        self.stats.paced_writes += 1
        self.stats.paced_seconds += time.monotonic() - started

    def _pace(self) -> None:
        with self._delivery.cond:
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
        delivery = self._delivery
        with delivery.cond:
            self._check_open()
            delivery.start()
            if delivery.accept(batch, nbytes):
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
        delivery = self._delivery
        with delivery.cond:
            self._check_open()
            delivery.start()
            accepted = delivery.accept_in_memory(batch, nbytes)
            behind = self._behind()
        if not accepted:
            await asyncio.to_thread(self.write, batch)
        elif behind:  # this coroutine waits; the others run on, until they wait too
            await asyncio.to_thread(self._pace)

    def _check_open(self) -> None:
        if self._delivery.closing:
            raise SinkError(f"{self.name} is closed", retryable=False)

    # ---- flush / close ----

    def force_flush(self, timeout: float | None = None) -> bool:
        """Deliver everything accepted so far and flush `inner`; True if that finished in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delivery = self._delivery
        with delivery.cond:
            if self._closed:
                return delivery.unfinished() <= 0
            delivery.start()
            target = self.stats.accepted
            delivery.request_flush(target)
            while not delivery.flushed(target):
                error = delivery.take_flush_error()
                if error is not None:
                    msg = f"{self.name}: flush failed: {error}"
                    raise SinkError(msg, retryable=False) from error
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                delivery.cond.wait(remaining if remaining is not None else 1.0)
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
        delivery = self._delivery
        if not delivery.stop(timeout):
            return  # closed, or being closed, by another call
        leftover = delivery.save_leftover()
        try:
            self.inner.close()
        except Exception as exc:
            logger.error("%s: closing the destination failed: %s", self.name, exc)
            if not leftover:
                raise
        finally:
            delivery.close_logs()
            self._closed = True
        if leftover:
            raise SinkError(leftover, retryable=True)

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
