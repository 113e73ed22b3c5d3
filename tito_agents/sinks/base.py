"""The sink interface and the in-process sinks (memory, callback).

Threading: `write` may be called from any thread; implementations serialise it themselves.
Blocking: the sync methods may block on I/O; the async twins default to the sync ones, which is right
for local sinks whose writes take microseconds. Failure: a sink raises `SinkError` with `retryable`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Self

from tito_agents.samples import Sample


class Sink:
    """Base class of every sink. Subclasses implement `write` and usually `flush` and `close`."""

    def write(self, samples: Sequence[Sample]) -> None:
        """Store samples. Each sample is stored whole or not at all."""
        raise NotImplementedError

    def flush(self) -> None:
        """Push buffered samples to their destination; returns once they are there."""

    def close(self) -> None:
        """Flush and release resources. Idempotent."""
        self.flush()

    async def awrite(self, samples: Sequence[Sample]) -> None:
        self.write(samples)

    async def aflush(self) -> None:
        self.flush()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemorySink(Sink):
    """Keeps samples in a list: for tests and for custom in-process hand-offs."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self._lock = threading.Lock()

    def write(self, samples: Sequence[Sample]) -> None:
        with self._lock:
            self.samples.extend(samples)


class CallbackSink(Sink):
    """Calls `callback(samples)` for every batch; the callback's exceptions propagate."""

    def __init__(self, callback: Callable[[Sequence[Sample]], None]) -> None:
        self._callback = callback

    def write(self, samples: Sequence[Sample]) -> None:
        self._callback(samples)
