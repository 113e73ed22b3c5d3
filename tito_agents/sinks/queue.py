"""An in-process bounded asyncio queue between rollout producers and a consumer in the same loop.

`AsyncQueueSink` is the hand-off for a trainer (or a batching stage) living in the same asyncio
program as the agents. Memory never grows past `maxsize` samples (and `max_bytes`):

* **backpressure by default**: when the queue is full, `awrite` waits until the consumer takes
  samples, so a slow consumer slows the producers;
* **spill** with `spill_dir`: when the queue is full, samples go to a local spill log instead and
  the consumer reads them after the queued ones, in order; producers never wait.

Threading: the queue belongs to one event loop (the one running when it is first used, or
`loop=`). `write` from another thread waits for room like `awrite`; `write` on the loop's own
thread cannot wait without deadlocking the loop, so when the queue is full it spills, or raises
`SinkError(retryable=True)` without a spill log. Use `awrite` in async code.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import lifecycle
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import sample_nbytes
from tito_agents.sinks.spill import SpillLog

logger = logging.getLogger("tito_agents.sinks")


class AsyncQueueSink(Sink):
    """A bounded in-process queue of samples with an async reader (see the module docstring).

    Reader side: ``async for sample in sink`` (ends after `close` once drained), or
    ``await sink.get_batch(max_samples, timeout)``.
    """

    def __init__(
        self,
        maxsize: int = 1024,
        *,
        max_bytes: int | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if maxsize < 1:
            raise ConfigurationError("maxsize must be >= 1")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.spill_dir = Path(spill_dir).expanduser() if spill_dir is not None else None
        self._spill = SpillLog(self.spill_dir) if self.spill_dir is not None else None
        self._spilling = bool(self._spill and self._spill.pending)
        self._items: deque[Sample] = deque()
        self._bytes = 0
        self._loop = loop
        self._changed: asyncio.Condition | None = None
        self._closed = False
        self.put_count = 0
        self.get_count = 0
        self.spilled = 0
        self.backpressure_waits = 0
        lifecycle.track(self)

    def __repr__(self) -> str:
        return f"AsyncQueueSink(maxsize={self.maxsize})"

    # ---- loop binding ----

    def _bind(self) -> asyncio.Condition:
        """The condition of the running loop; binds the queue to it on first async use."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise ConfigurationError("an AsyncQueueSink is used from one event loop only")
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _on_loop_thread(self) -> bool:
        if self._loop is None:
            return True
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    # ---- producers ----

    @property
    def qsize(self) -> int:
        """Samples waiting in memory (spilled ones not included)."""
        return len(self._items)

    @property
    def pending(self) -> int:
        """Samples not yet taken by the consumer (memory and spill log)."""
        return len(self._items) + (self._spill.pending if self._spill else 0)

    def _room_for(self, count: int, nbytes: int) -> bool:
        if self._spilling:
            return False
        if not self._items:
            return True
        return len(self._items) + count <= self.maxsize and (
            self.max_bytes is None or self._bytes + nbytes <= self.max_bytes
        )

    def _put_now(self, batch: list[Sample], nbytes: int) -> bool:
        """Queue or spill `batch` without waiting; False if it must wait for room."""
        if self._closed:
            raise SinkError(f"{self!r} is closed", retryable=False)
        if self._room_for(len(batch), nbytes):
            self._items.extend(batch)
            self._bytes += nbytes
        elif self._spill is not None:
            self._spill.append(batch)
            self._spilling = True
            self.spilled += len(batch)
        else:
            return False
        self.put_count += len(batch)
        return True

    async def awrite(self, samples: Sequence[Sample]) -> None:
        """Queue samples; waits while the queue is full (or spills, with a spill log)."""
        if not samples:
            return
        batch = list(samples)
        nbytes = sum(sample_nbytes(s) for s in batch)
        changed = self._bind()
        async with changed:
            waited = False
            while not self._put_now(batch, nbytes):
                if not waited:
                    self.backpressure_waits += 1
                    waited = True
                await changed.wait()
            changed.notify_all()

    def write(self, samples: Sequence[Sample]) -> None:
        """Queue samples from sync code (see the module docstring for the loop-thread rule)."""
        if not samples:
            return
        if self._loop is not None and not self._on_loop_thread():
            asyncio.run_coroutine_threadsafe(self.awrite(samples), self._loop).result()
            return
        batch = list(samples)
        if not self._put_now(batch, sum(sample_nbytes(s) for s in batch)):
            raise SinkError(
                f"{self!r} is full and write() on the event-loop thread cannot wait; use "
                "`await sink.awrite(...)` or give spill_dir",
                retryable=True,
            )
        self._notify_soon()

    def _notify_soon(self) -> None:
        if self._loop is None or self._changed is None:
            return
        changed = self._changed

        async def notify() -> None:
            async with changed:
                changed.notify_all()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._loop.create_task(notify())
        else:
            asyncio.run_coroutine_threadsafe(notify(), self._loop)

    # ---- consumer ----

    def _take(self, max_samples: int) -> list[Sample]:
        taken: list[Sample] = []
        while self._items and len(taken) < max_samples:
            sample = self._items.popleft()
            self._bytes -= sample_nbytes(sample)
            taken.append(sample)
        if not taken and self._spill is not None and self._spilling:
            spilled = self._spill.read_batch(max_samples)
            if spilled is None:
                self._spilling = False
            else:
                self._spill.commit(spilled)  # in-process: handing over is delivery
                taken = spilled.samples
        self.get_count += len(taken)
        return taken

    async def get_batch(self, max_samples: int = 64, timeout: float | None = None) -> list[Sample]:
        """Up to `max_samples` samples in order; waits for at least one (or `timeout` seconds,
        then returns []). Returns [] at once when closed and drained."""
        changed = self._bind()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        async with changed:
            while True:
                taken = self._take(max_samples)
                if taken or (self._closed and not self.pending):
                    if not taken:
                        self._release_spill()
                    changed.notify_all()
                    return taken
                if self._spilling and not self.pending:
                    self._spilling = False
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return []
                try:
                    await asyncio.wait_for(changed.wait(), remaining)
                except TimeoutError:
                    return []

    async def get(self) -> Sample:
        """The next sample; raises `SinkError(retryable=False)` when closed and drained."""
        batch = await self.get_batch(1)
        if not batch:
            raise SinkError(f"{self!r} is closed and drained", retryable=False)
        return batch[0]

    async def __aiter__(self) -> AsyncIterator[Sample]:
        while True:
            batch = await self.get_batch(64)
            if not batch:
                return
            for sample in batch:
                yield sample

    # ---- lifetime ----

    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> None:
        """Nothing to push: samples are in the consumer's reach as soon as `write` returns."""

    async def aflush(self) -> None:
        return None

    async def aclose(self, timeout: float | None = None) -> None:
        """Stop accepting samples and wait until the consumer has taken every one (or `timeout`
        seconds; what is left stays readable, and is spilled to disk at exit if a spill log is
        configured). Idempotent."""
        changed = self._bind()
        async with changed:
            self._closed = True
            changed.notify_all()
            try:
                await asyncio.wait_for(changed.wait_for(lambda: self.pending == 0), timeout)
            except TimeoutError:
                logger.warning("%r closed with %d samples not consumed", self, self.pending)
                return
        self._release_spill()

    def _release_spill(self) -> None:
        """Close the spill log once closed and drained (it removes its empty folder)."""
        if self._spill is not None and self._closed and not self.pending:
            self._spill.close()
            self._spill = None

    def close(self) -> None:
        """Stop accepting samples. From another thread, waits for the consumer to drain the
        queue like `aclose`; on the loop thread (which cannot wait) it only marks the end."""
        if self._loop is not None and not self._on_loop_thread() and not self._loop.is_closed():
            asyncio.run_coroutine_threadsafe(self.aclose(), self._loop).result()
            return
        self._closed = True
        self._notify_soon()

    def close_at_exit(self, timeout: float) -> str:
        self._closed = True
        left = list(self._items)
        if not left:
            self._release_spill()
            return "nothing was left unconsumed"
        if self._spill is not None:
            self._items.clear()
            self._spill.append(left)
            self._spill.close()
            return f"{len(left)} unconsumed samples spilled to {self._spill.folder}"
        return f"{len(left)} samples were never consumed (no spill_dir)"
