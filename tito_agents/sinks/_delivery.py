"""The delivery side of a `BufferedSink`: what its ``tito-delivery-<name>`` thread does with the
samples `write` accepted, and the spill log both sides share.

`Delivery` provides the hooks of the sink's `_worker.Worker`: each batch is everything waiting in
memory (up to `batch_size` samples and `batch_bytes`), else the next batch of the spill log, else a
pending flush of the destination. A batch is retried with backoff until the destination takes it
or refuses it for good; once delivery has failed for `spill_after` seconds, what waits in memory
and the batch being retried move to the front of the spill log (so a producer killed during an
outage loses at most that window), and `close` spills what it could not deliver.

A base class of `BufferedSink` (it holds the state; this module is its delivery half, split off to
keep the producer's side, `write` / `flush` / `close`, readable on its own).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tito_agents._worker import Worker, WorkSource
from tito_agents.config import DeliveryStats
from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import sample_nbytes
from tito_agents.sinks.retry import Backoff, is_retryable
from tito_agents.sinks.spill import SpillBatch, SpillLog

logger = logging.getLogger("tito_agents.sinks")

Batch = tuple[list[Sample], SpillBatch | None]
"""A unit of delivery work: samples and the spill-log batch they came from (None: from memory).
No samples: flush the destination."""


class Delivery:
    """The delivery half of `BufferedSink` (see the module docstring); its attributes are set by
    `BufferedSink.__init__`."""

    inner: Sink
    name: str
    stats: DeliveryStats
    batch_size: int
    batch_bytes: int
    linger: float
    spill_after: float
    retry: Backoff
    spill_dir: Path | None
    rejected_samples: list[Sample]
    _worker: Worker[Batch]
    _spill: SpillLog | None
    _rejected_log: SpillLog | None
    _memory: deque[Sample]
    _memory_bytes: int
    _inflight: int
    _spilling: bool
    _done: int
    """Samples delivered or rejected, in acceptance order."""
    _flush_target: int
    """`_done` value a pending flush waits for."""
    _flushed: int
    """Highest target for which inner.flush() succeeded."""
    _flush_error: BaseException | None
    _closing: bool

    @property
    def _cond(self) -> threading.Condition:
        """The lock of the sink's state (the worker's: a new one in a forked child)."""
        return self._worker.cond

    @property
    def pending(self) -> int:
        """Samples accepted and neither delivered nor rejected yet."""
        with self._cond:
            return self.stats.accepted - self._done

    def _new_worker(self, after_fork: Callable[[], None]) -> Worker[Batch]:
        """The delivery thread, driven by the hooks below; `after_fork` resets the sink's state
        in a forked child."""
        source = WorkSource(
            waiting=self._waiting,
            linger=self._linger_for,
            take=self._take,
            finished=self._finished,
            run=self._run_batch,
            after_fork=after_fork,
        )
        return Worker(source, name=f"tito-delivery-{self.name}")

    # ---- the worker's source (`_worker.WorkSource`; called with the lock, but `_run_batch`) ----

    def _waiting(self) -> int:
        return len(self._memory)

    def _linger_for(self, waiting: int) -> float:
        """Linger only to fill a batch, and never while a flush or `close` waits."""
        if waiting >= self.batch_size or self._closing or self._flush_target > self._done:
            return 0.0
        return self.linger

    def _finished(self) -> bool:
        return self._closing or self._worker.abort.is_set()

    def _take(self) -> Batch | None:
        if self._memory:
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
        if self._flush_target > self._flushed and self._done >= self._flush_target:
            return [], None  # idle with a flush pending: flush the destination
        return None

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

    def _run_batch(self, work: Batch) -> bool:
        batch, spilled = work
        if not batch:
            self._flush_inner()
            return True
        outcome = self._deliver(batch, spilled)
        if outcome == "aborted":
            self._hand_back(batch, spilled)
            return False
        with self._cond:
            self._inflight = 0
            if outcome == "spilled":  # now at the front of the spill log
                self.stats.buffered = len(self._memory)
                return True
            self._worker.recovered()
            self._worker.batch_done()
            self._done += len(batch)
            self.stats.exported += len(batch)
            if spilled is not None and self._spill is not None:
                self._spill.commit(spilled)
                self.stats.replayed += len(batch)
                self.stats.spill_pending = self._spill.pending
            self.stats.buffered = len(self._memory)
            self._cond.notify_all()
        return True

    # ---- delivering, retrying ----

    def _deliver(
        self, batch: list[Sample], spilled: SpillBatch | None
    ) -> Literal["delivered", "spilled", "aborted"]:
        """Hand `batch` to the destination, retrying: "delivered" (or rejected for good);
        "spilled" when a memory batch moved to the spill log because delivery has failed for
        `spill_after` seconds; "aborted" by `close`. The backoff carries over from batch to batch
        until a delivery succeeds."""
        worker = self._worker
        wait = worker.retry_at - time.monotonic()
        if wait > 0 and worker.sleep(wait):  # the backoff a moved batch was serving
            return "aborted"
        while True:
            try:
                self.inner.write(batch)
                return "delivered"
            except Exception as exc:
                with self._cond:
                    self.stats.failed_attempts += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    worker.failing()
                if not is_retryable(exc):
                    self._reject(batch, exc)
                    return "delivered"
                attempt, retry_at = worker.backoff(self.retry)
                if attempt == 0 or attempt % 20 == 0:
                    logger.warning(
                        "%s: delivery failed (%s); retrying with backoff, %d samples buffered",
                        self.name,
                        exc,
                        self.pending,
                    )
                while True:
                    if spilled is None and self._spill_batch(batch):
                        worker.retry_at = retry_at
                        return "spilled"
                    now = time.monotonic()
                    if now >= retry_at:
                        break
                    wait = retry_at - now
                    if spilled is None and self.spill_dir is not None:
                        with self._cond:  # wake when the window ends, not at the next retry
                            since = worker.failing_since or now
                        wait = min(wait, max(0.0, since + self.spill_after - now) + 0.001)
                    if worker.sleep(wait):
                        return "aborted"

    def _flush_inner(self) -> None:
        with self._cond:
            target = self._flush_target
        attempt = 0
        while True:
            try:
                self.inner.flush()
                break
            except Exception as exc:
                if not is_retryable(exc):
                    with self._cond:
                        self._flush_error = exc
                        self._flushed = target
                        self._cond.notify_all()
                    return
                with self._cond:
                    self.stats.failed_attempts += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                attempt += 1
                if self._worker.sleep(self.retry.delay(attempt)):
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
            except Exception as spill_exc:  # never the delivery thread's end: kept in memory
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

    # ---- spilling ----

    def _spill_log(self) -> SpillLog | None:
        """The spill log, opened on first use in a forked child (see `after_fork`)."""
        if self._spill is None and self.spill_dir is not None:
            self._spill = SpillLog(self.spill_dir)
        return self._spill

    def _spill_due(self) -> bool:
        """Delivery has been failing for `spill_after` seconds and there is a spill log: samples
        must not wait in memory any more."""
        since = self._worker.failing_since
        return (
            since is not None
            and self.spill_dir is not None
            and time.monotonic() - since >= self.spill_after
        )

    def _spill_batch(self, batch: list[Sample]) -> bool:
        """Once delivery has failed for `spill_after` seconds, move the batch being retried (and
        memory behind it) to the front of the spill log; True if it moved."""
        with self._cond:
            return self._spill_due() and self._spill_memory_locked(batch)

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
                time.monotonic() - (self._worker.failing_since or time.monotonic()),
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

    def _save_leftover(self) -> str:
        """Spill what the worker could not deliver by `close`; the message for the caller, or ''."""
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
