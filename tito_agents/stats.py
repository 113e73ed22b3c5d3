"""What delivery counts: `DeliveryStats`, the counters of a `BufferedSink` (retries, spills,
refusals). Plain data importing nothing of the library, so `config.CaptureStats` (which reports
them as `delivery`) and the sinks that update them share one definition, and no stage imports a
sink for a counter.

`ExportStats` is its former name, kept importable (with a `DeprecationWarning`) for code written
before the export/delivery vocabulary was settled (issue 27)."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

__all__ = ["DeliveryStats"]


@dataclass(slots=True)
class DeliveryStats:
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
    paced_writes: int = 0
    """`write` / `awrite` calls that gave the worker its turn (it was `pace_after` behind)."""
    paced_seconds: float = 0.0
    last_error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def __getattr__(name: str) -> type[DeliveryStats]:
    """`ExportStats`: the deprecated name of `DeliveryStats`, with a warning."""
    if name != "ExportStats":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        "tito_agents.stats.ExportStats is deprecated: use tito_agents.stats.DeliveryStats",
        DeprecationWarning,
        stacklevel=2,
    )
    return DeliveryStats
