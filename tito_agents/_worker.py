"""The one worker thread of the library: a queue drained in batches by one daemon thread, with
lingering for busy producers, backoff for retries, and a fresh thread and lock in a forked child.

Two stages hand work to a thread so that the caller never waits for it, and both need the same
care: export (`export.SampleProcessor`'s ``tito-processor`` thread assembles the calls made outside
any episode) and delivery (`sinks.BufferedSink`'s ``tito-delivery-<name>`` thread hands batches to
a sink, retrying). Each says what its queue holds and what a batch does (`WorkSource`); the
`Worker` owns the thread and the lock, and decides when to wait and for how long:

* a lone item is taken at once; items that come more often than the source's linger wait for each
  other (a thread wake-up costs more CPU than handling a small item, so a busy producer pays it
  once per batch), and a producer wakes a lingering thread only when the batch is full (`wake`);
* retries back off exponentially (a `Backoff` policy), carrying over from batch to batch until
  one succeeds, and every wait is cut short by `abort` (a `close` that ran out of time);
* in a forked child the parent's thread does not exist and its lock may be held forever: every
  worker gets a new lock, no thread, no backoff, and its source starts over (`after_fork`).

A base module: it imports nothing of the library, so any stage may use it.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

W = TypeVar("W")


class Backoff(Protocol):
    """How long to wait before a retry (`sinks.Backoff`)."""

    def delay(self, attempt: int) -> float:
        """Seconds before retry number `attempt` (0: the first retry)."""
        ...


@dataclass(frozen=True, slots=True)
class WorkSource(Generic[W]):
    """What a `Worker` drains: the owner's hooks (its own, private methods). Every hook but `run`
    is called with the worker's lock held."""

    waiting: Callable[[], int]
    """Items queued now that the next batch would take (0: none)."""
    linger: Callable[[int], float]
    """Seconds a batch of that many items may wait for more, if the last batch finished less than
    that ago; 0: take them now (the batch is full, or someone waits for the queue)."""
    take: Callable[[], W | None]
    """The next unit of work, taken off the queue; None when there is nothing to do now."""
    finished: Callable[[], bool]
    """Nothing to do and nothing more will come: the thread ends."""
    run: Callable[[W], bool]
    """Do the work, without the lock; False ends the thread (`abort`: the work was handed back)."""
    after_fork: Callable[[], None]
    """In a forked child, after the worker reset itself: start over with an empty queue (the parent
    keeps handling what it had queued)."""


class Worker(Generic[W]):
    """One daemon thread named `name` draining `source` (see the module docstring).

    The source and whoever feeds it share `cond` (its lock guards the queue): a producer queues
    under it, calls `start` and `wake`; waiters for the queue use `cond.wait`. After a fork `cond`
    is a new object, so read it from the worker each time, never keep it.
    """

    def __init__(self, source: WorkSource[W], name: str) -> None:
        self.source = source
        self.name = name
        self._reset()
        _watch(self)

    def __repr__(self) -> str:
        return f"Worker({self.name!r})"

    def _reset(self) -> None:
        """A fresh lock and no thread (in a forked child, also at creation)."""
        self.cond = threading.Condition()
        self.abort = threading.Event()
        """Set by a `close` that ran out of time: every backoff wait ends at once."""
        self.thread: threading.Thread | None = None
        self.idle = False
        """The thread waits for work: a new item must wake it (a lingering one must not)."""
        self.lingering = False
        self.batch_done_at = float("-inf")
        """When the source last finished a batch (monotonic): lingering is for busy producers."""
        self.failures = 0
        """Failed attempts since the last success: the backoff goes on from batch to batch."""
        self.failing_since: float | None = None
        """When the first of those failed (monotonic); None while healthy."""
        self.retry_at = 0.0
        """When to retry work put aside during a backoff (e.g. a batch moved to a spill log)."""

    # ---- the producer's side (call with `cond` held) ----

    def start(self) -> None:
        """Start the thread unless it runs (it ends when the source is `finished`)."""
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self.thread.start()

    def wake(self, full: bool) -> None:
        """Items were queued: wake the thread if it waits for work, or if the batch is `full`; a
        lingering thread is left to linger (one wake-up per batch, not per item)."""
        if self.idle or full:
            self.cond.notify_all()

    # ---- the thread ----

    def _run(self) -> None:
        while True:
            with self.cond:
                work = self._next()
            if work is None or not self.source.run(work):
                return

    def _next(self) -> W | None:
        """Wait for work, lingering once per batch while items come often. Called with the lock."""
        lingered = False
        while True:
            waiting = self.source.waiting()
            if waiting and not lingered:
                linger = self.source.linger(waiting)
                if linger > 0 and time.monotonic() - self.batch_done_at < linger:
                    lingered = self.lingering = True
                    try:
                        self.cond.wait(linger)  # later items join this batch
                    finally:
                        self.lingering = False
                    continue  # the queue may have changed meanwhile
            work = self.source.take()
            if work is not None:
                return work
            if self.source.finished():
                return None
            self.idle = True
            try:
                self.cond.wait()
            finally:
                self.idle = False

    def batch_done(self) -> None:
        """The source finished a batch now: items that come within its linger wait for more."""
        self.batch_done_at = time.monotonic()

    # ---- backoff (the thread's side) ----

    def failing(self) -> float:
        """An attempt failed: when the failures began (monotonic). Call with the lock."""
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        return self.failing_since

    def backoff(self, policy: Backoff) -> tuple[int, float]:
        """The number of this retry since the last success (0: the first) and when to make it
        (monotonic); the count goes on from batch to batch until `recovered`."""
        attempt = self.failures
        self.failures += 1
        return attempt, time.monotonic() + policy.delay(attempt)

    def recovered(self) -> None:
        """An attempt succeeded: the next failure starts the backoff over. Call with the lock."""
        self.failures = 0
        self.failing_since = None

    def sleep(self, seconds: float) -> bool:
        """Wait `seconds` (without the lock); True if `abort` cut the wait short."""
        return self.abort.wait(seconds)


_workers: weakref.WeakSet[Worker[Any]] = weakref.WeakSet()
_hooked = False
_hook_lock = threading.Lock()


def _watch(worker: Worker[Any]) -> None:
    """Reset `worker` in a forked child. The fork hook is registered at the first worker, not at
    import: hooks run in registration order, so those the stages register at import (the at-exit
    registry forgetting its parent's sinks) run first and a source may re-register in
    `after_fork`."""
    global _hooked
    with _hook_lock:
        _workers.add(worker)
        if not _hooked:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _hooked = True


def _after_fork_in_child() -> None:
    global _hook_lock
    _hook_lock = threading.Lock()  # another thread may have held it at the fork
    for worker in list(_workers):
        worker._reset()
        worker.source.after_fork()
