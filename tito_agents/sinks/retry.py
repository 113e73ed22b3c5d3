"""What a `BufferedSink` does when delivery is slow or fails: the retry backoff (`Backoff`),
which failures are worth a retry (`is_retryable`), and the limits of its buffer, spilling and
pacing (`check_buffer_options`, `PACE_TIMEOUT`). Plain rules apart from the buffer's mechanics,
so they read (and are tested) on their own."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tito_agents.errors import ConfigurationError, SinkError

__all__ = ["PACE_TIMEOUT", "Backoff", "check_buffer_options", "is_retryable"]


@dataclass(frozen=True, slots=True)
class Backoff:
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


PACE_TIMEOUT = 0.1
"""The longest one `write` waits for the delivery thread to catch up (a slow destination is not
paced beyond it: memory grows, then spills at the bound)."""


def is_retryable(exc: BaseException) -> bool:
    """A failure worth retrying: a `SinkError` that says so, or an I/O, connection or timeout
    error (the destination may come back); anything else is a refusal for good."""
    if isinstance(exc, SinkError):
        return exc.retryable
    return isinstance(exc, OSError | ConnectionError | TimeoutError)


def check_buffer_options(
    *,
    max_buffer_samples: int,
    batch_size: int,
    batch_bytes: int,
    spill_after: float,
    pace_after: int | None,
) -> None:
    """Raise `ConfigurationError` for a bound, batch, spill window or pacing threshold that
    cannot work (at construction, not at the first write)."""
    if max_buffer_samples < 1 or batch_size < 1 or batch_bytes < 1:
        raise ConfigurationError("max_buffer_samples, batch_size and batch_bytes must be >= 1")
    if pace_after is not None and pace_after < 1:
        raise ConfigurationError(f"pace_after must be >= 1 sample or None, not {pace_after}")
    if not spill_after >= 0:
        raise ConfigurationError(f"spill_after must be >= 0 seconds, not {spill_after}")
