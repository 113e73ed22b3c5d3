"""The delivery worker of a `BufferedSink`: the samples its `write` accepted (in memory or in the
spill log), and what its ``tito-delivery-<name>`` thread does with them.

`Delivery` holds the queue and drives the sink's `_worker.Worker`: each batch is everything
waiting in memory (up to `batch_size` samples and `batch_bytes`), else the next batch of the spill
log, else a pending flush of the destination. A batch is retried with backoff until the destination
takes it or refuses it for good (then rejected: `rejected_samples`, ``<spill_dir>/rejected/``);
once delivery has failed for `spill_after` seconds, what waits in memory and the batch being
retried move to the front of the spill log (so a producer killed during an outage loses at most
that window), and `close` spills what it could not deliver.

The sink holds one `Delivery` and reaches it through the public methods below (the producer's
side: accept, pace, flush, close); the delivery reads the sink's settings and counters through
`DeliveryConfig` at each use, so a setting changed on the sink (`sink.retry = ...`) applies to the
next batch. Every method named "locked" or documented so is called with `cond` held.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

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


class DeliveryConfig(Protocol):
    """What delivery reads of its sink (`BufferedSink`'s public attributes): the destination, the
    settings and the counters, read at each use."""

    inner: Sink
    name: str
    stats: DeliveryStats
    max_buffer_samples: int
    max_buffer_bytes: int
    batch_size: int
    batch_bytes: int
    linger: float
    spill_after: float
    retry: Backoff
    spill_dir: Path | None
    rejected_samples: list[Sample]


class Delivery:
    """The queue of a `BufferedSink` and its delivery thread (see the module docstring).

    config: the sink. after_fork: resets the sink's own state in a forked child, after the
    delivery reset its own (the parent keeps delivering what it had accepted).
    """

    def __init__(self, config: DeliveryConfig, after_fork: Callable[[], None]) -> None:
        self.config = config
        self._sink_after_fork = after_fork
        self._worker: Worker[Batch] = Worker(
            WorkSource(
                waiting=self._waiting,
                linger=self._linger_for,
                take=self._take,
                finished=self._finished,
                run=self._run_batch,
                after_fork=self._reset_after_fork,
            ),
            name=f"tito-delivery-{config.name}",
        )
        # Opened now so a spill log left by a crashed process is replayed at once.
        spill_dir = config.spill_dir
        self._spill = SpillLog(spill_dir) if spill_dir is not None else None
        self._rejected_log: SpillLog | None = None
        self._memory: deque[Sample] = deque()
        self._memory_bytes = 0
        self._inflight = 0
        self._spilling = False
        self._done = 0
        """Samples delivered or rejected, in acceptance order."""
        self._flush_target = 0
        """`_done` value a pending flush waits for."""
        self._flushed = 0
        """Highest target for which inner.flush() succeeded."""
        self._flush_error: BaseException | None = None
        self.closing = False
        """`close` has begun: nothing more is accepted; the thread ends once the queue is empty."""
        if self._spill is not None:
            config.stats.spill_pending = self._spill.pending
            if config.stats.spill_pending:
                self._spilling = True
                with self.cond:
                    self._worker.start()

    def _reset_after_fork(self) -> None:
        """In a forked child (the worker has a new lock and no thread): an empty queue, and
        (lazily) the child's own spill folder."""
        self._memory = deque()
        self._memory_bytes = self._inflight = 0
        self._done = self._flush_target = self._flushed = 0
        self._spilling = False
        self._spill = None  # the parent's files stay the parent's
        self._rejected_log = None
        self.closing = False
        self._sink_after_fork()

    @property
    def cond(self) -> threading.Condition:
        """The lock of the queue and the sink's counters (the worker's: a new one in a forked
        child, so read it here each time, never keep it)."""
        return self._worker.cond

    # ---- the producer's side (called by the sink, with `cond` held) ----

    def unfinished(self) -> int:
        """Samples accepted and neither delivered nor rejected yet."""
        return self.config.stats.accepted - self._done

    def _unfinished_now(self) -> int:
        with self.cond:
            return self.unfinished()

    def start(self) -> None:
        """Start the delivery thread unless it runs."""
        self._worker.start()

    def behind(self, pace_after: int | None) -> bool:
        """`pace_after` samples wait in memory for a healthy destination: the thread is behind."""
        return (
            pace_after is not None
            and len(self._memory) >= pace_after
            and self._worker.failing_since is None
            and not self._spilling
            and not self.closing
        )

    def accept_in_memory(self, batch: list[Sample], nbytes: int) -> bool:
        """Put `batch` in memory if memory is where it belongs now and there is room."""
        if self._spilling or self._spill_due() or not self._fits(len(batch), nbytes):
            return False
        self._enqueue_memory(batch, nbytes)
        return True

    def accept(self, batch: list[Sample], nbytes: int) -> bool:
        """Put `batch` in memory or the spill log; False when it must wait for room."""
        if self.accept_in_memory(batch, nbytes):
            return True
        if self._spill_due() and (self._memory or not self._spilling):
            self._spill_memory_locked([])  # what waits in memory goes first, keeping the order
        if not self._spilling and self._fits(len(batch), nbytes):
            self._enqueue_memory(batch, nbytes)  # the spill log refused: memory, as before
            return True
        spill = self._spill_log()
        if spill is None:
            return False
        stats = self.config.stats
        try:
            spill.append(batch)
        except SinkError as exc:
            return self._spill_refused(exc, "applying backpressure")
        if not self._spilling:
            logger.warning(
                "%s: buffer full (%d samples); spilling to %s until the destination catches up",
                self.config.name,
                len(self._memory),
                spill.folder,
            )
        self._spilling = True
        stats.accepted += len(batch)
        stats.spilled += len(batch)
        stats.spill_pending = spill.pending
        self.cond.notify_all()
        return True

    def request_flush(self, target: int) -> None:
        """Flush the destination once `target` samples are delivered."""
        self._flush_target = max(self._flush_target, target)
        self.cond.notify_all()

    def flushed(self, target: int) -> bool:
        """`target` samples are delivered and the destination flushed after them."""
        return self._flushed >= target and self._done >= target

    def take_flush_error(self) -> BaseException | None:
        """The error of a flush the destination refused for good (reported once)."""
        error, self._flush_error = self._flush_error, None
        return error

    # ---- closing (called by the sink, without the lock) ----

    def stop(self, timeout: float) -> bool:
        """Stop accepting and let the thread deliver what is queued, for up to `timeout`
        seconds; then cut its backoff short (the batch it holds is handed back). False, doing
        nothing, when another call stopped it already."""
        with self.cond:
            if self.closing:
                return False
            self.closing = True
            self.cond.notify_all()
            thread = self._worker.thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                self._worker.abort.set()
                with self.cond:
                    self.cond.notify_all()
                thread.join()
        return True

    def close_logs(self) -> None:
        if self._spill is not None:
            self._spill.close()
        if self._rejected_log is not None:
            self._rejected_log.close()

    # ---- accepting ----

    def _fits(self, count: int, nbytes: int) -> bool:
        if not self._memory:
            return True
        config = self.config
        return (
            len(self._memory) + count <= config.max_buffer_samples
            and self._memory_bytes + nbytes <= config.max_buffer_bytes
        )

    def _enqueue_memory(self, batch: list[Sample], nbytes: int) -> None:
        stats = self.config.stats
        self._memory.extend(batch)
        self._memory_bytes += nbytes
        stats.accepted += len(batch)
        stats.buffered = len(self._memory) + self._inflight
        self._worker.wake(full=len(self._memory) >= self.config.batch_size)

    # ---- the worker's source (`_worker.WorkSource`; called with the lock, but `_run_batch`) ----

    def _waiting(self) -> int:
        return len(self._memory)

    def _linger_for(self, waiting: int) -> float:
        """Linger only to fill a batch, and never while a flush or `close` waits."""
        if waiting >= self.config.batch_size or self.closing or self._flush_target > self._done:
            return 0.0
        return self.config.linger

    def _finished(self) -> bool:
        return self.closing or self._worker.abort.is_set()

    def _take(self) -> Batch | None:
        if self._memory:
            batch = self._take_memory_locked()
            self._inflight = len(batch)
            self.cond.notify_all()  # paced writers: the worker took its turn
            return batch, None
        if self._spill is not None and self._spilling:
            spilled = self._spill.read_batch(self.config.batch_size, self.config.batch_bytes)
            if spilled is not None:
                self._inflight = len(spilled.samples)
                return spilled.samples, spilled
            self._spilling = False  # replayed to the end: back to memory
            self.config.stats.spill_pending = 0
            self.cond.notify_all()
        if self._flush_target > self._flushed and self._done >= self._flush_target:
            return [], None  # idle with a flush pending: flush the destination
        return None

    def _take_memory_locked(self) -> list[Sample]:
        """Everything waiting, up to `batch_size` samples and `batch_bytes` (at least one)."""
        batch: list[Sample] = []
        nbytes = 0
        while self._memory and len(batch) < self.config.batch_size:
            size = sample_nbytes(self._memory[0])
            if batch and nbytes + size > self.config.batch_bytes:
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
        with self.cond:
            self._inflight = 0
            if outcome == "spilled":  # now at the front of the spill log
                self.config.stats.buffered = len(self._memory)
                return True
            self._worker.recovered()
            self._worker.batch_done()
            self._done += len(batch)
            self.config.stats.exported += len(batch)
            if spilled is not None and self._spill is not None:
                self._spill.commit(spilled)
                self.config.stats.replayed += len(batch)
                self.config.stats.spill_pending = self._spill.pending
            self.config.stats.buffered = len(self._memory)
            self.cond.notify_all()
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
                self.config.inner.write(batch)
                return "delivered"
            except Exception as exc:
                with self.cond:
                    self.config.stats.failed_attempts += 1
                    self.config.stats.last_error = f"{type(exc).__name__}: {exc}"
                    worker.failing()
                if not is_retryable(exc):
                    self._reject(batch, exc)
                    return "delivered"
                attempt, retry_at = worker.backoff(self.config.retry)
                if attempt == 0 or attempt % 20 == 0:
                    logger.warning(
                        "%s: delivery failed (%s); retrying with backoff, %d samples buffered",
                        self.config.name,
                        exc,
                        self._unfinished_now(),
                    )
                while True:
                    if spilled is None and self._spill_batch(batch):
                        worker.retry_at = retry_at
                        return "spilled"
                    now = time.monotonic()
                    if now >= retry_at:
                        break
                    wait = retry_at - now
                    if spilled is None and self.config.spill_dir is not None:
                        with self.cond:  # wake when the window ends, not at the next retry
                            since = worker.failing_since or now
                        wait = min(wait, max(0.0, since + self.config.spill_after - now) + 0.001)
                    if worker.sleep(wait):
                        return "aborted"

    def _flush_inner(self) -> None:
        with self.cond:
            target = self._flush_target
        attempt = 0
        while True:
            try:
                self.config.inner.flush()
                break
            except Exception as exc:
                if not is_retryable(exc):
                    with self.cond:
                        self._flush_error = exc
                        self._flushed = target
                        self.cond.notify_all()
                    return
                with self.cond:
                    self.config.stats.failed_attempts += 1
                    self.config.stats.last_error = f"{type(exc).__name__}: {exc}"
                attempt += 1
                if self._worker.sleep(self.config.retry.delay(attempt)):
                    return
        with self.cond:
            self._flushed = max(self._flushed, target)
            self.cond.notify_all()

    def _reject(self, batch: list[Sample], exc: BaseException) -> None:
        logger.error(
            "%s: destination refused %d samples for good (%s); kept in rejected_samples%s",
            self.config.name,
            len(batch),
            exc,
            f" and {self.config.spill_dir}/rejected" if self.config.spill_dir else "",
        )
        self.config.rejected_samples.extend(batch)
        if self.config.spill_dir is not None:
            try:
                if self._rejected_log is None:
                    self._rejected_log = SpillLog(self.config.spill_dir / "rejected")
                self._rejected_log.append(batch)
            except Exception as spill_exc:  # never the delivery thread's end: kept in memory
                logger.error("%s: cannot record rejected samples: %s", self.config.name, spill_exc)
        with self.cond:
            self.config.stats.rejected += len(batch)

    def _hand_back(self, batch: list[Sample], spilled: SpillBatch | None) -> None:
        """Return an undelivered in-flight batch so `close` can spill it (a spilled batch is
        still in its log, uncommitted)."""
        with self.cond:
            self._inflight = 0
            if spilled is None:
                self._memory.extendleft(reversed(batch))
                self._memory_bytes += sum(sample_nbytes(s) for s in batch)
            self.cond.notify_all()

    # ---- spilling ----

    def _spill_log(self) -> SpillLog | None:
        """The spill log, opened on first use in a forked child (see `after_fork`)."""
        if self._spill is None and self.config.spill_dir is not None:
            self._spill = SpillLog(self.config.spill_dir)
        return self._spill

    def _spill_due(self) -> bool:
        """Delivery has been failing for `spill_after` seconds and there is a spill log: samples
        must not wait in memory any more."""
        since = self._worker.failing_since
        return (
            since is not None
            and self.config.spill_dir is not None
            and time.monotonic() - since >= self.config.spill_after
        )

    def _spill_batch(self, batch: list[Sample]) -> bool:
        """Once delivery has failed for `spill_after` seconds, move the batch being retried (and
        memory behind it) to the front of the spill log; True if it moved."""
        with self.cond:
            return self._spill_due() and self._spill_memory_locked(batch)

    def _spill_refused(self, exc: SinkError, outcome: str) -> bool:
        """Count and log a spill the disk refused; False, for the caller to return."""
        self.config.stats.spill_failures += 1
        self.config.stats.last_error = str(exc)
        logger.error("%s: cannot spill, %s: %s", self.config.name, outcome, exc)
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
                self.config.name,
                time.monotonic() - (self._worker.failing_since or time.monotonic()),
                len(moved),
                spill.folder,
            )
        self._memory.clear()
        self._memory_bytes = 0
        self._spilling = True
        self.config.stats.spilled += len(moved)
        self.config.stats.spill_pending = spill.pending
        self.config.stats.buffered = self._inflight
        self.cond.notify_all()
        return True

    def save_leftover(self) -> str:
        """Spill what the thread could not deliver by `close` (after `stop`, without the lock);
        the message for the caller, or ''."""
        with self.cond:
            left = list(self._memory)
            self._memory.clear()
            self._memory_bytes = 0
            self.config.stats.buffered = 0
        if not left:
            return ""
        spill = self._spill_log()
        if spill is not None:
            try:
                spill.prepend(left)  # older than anything spilled: replayed first
            except SinkError as exc:
                self.config.stats.spill_failures += 1
                return (
                    f"{self.config.name}: {len(left)} samples not delivered and not spilled: {exc}"
                )
            self.config.stats.spilled += len(left)
            self.config.stats.spill_pending = spill.pending
            logger.warning(
                "%s: %d samples not delivered before close; spilled to %s "
                "(the next BufferedSink on %s delivers them)",
                self.config.name,
                len(left),
                spill.folder,
                self.config.spill_dir,
            )
            return ""
        return (
            f"{self.config.name}: {len(left)} samples not delivered before close and no spill_dir "
            f"(last error: {self.config.stats.last_error})"
        )
