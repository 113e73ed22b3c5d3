"""Duplicate removal by `sample_id` for at-least-once transports (Redis Streams, Ray, spill replay).

Retries make a sample arrive twice; readers drop the second copy so that what a trainer sees is
exactly once. The memory is bounded: only the most recent `window` ids are remembered, which covers
every retry (retries resend recent samples), not a replay of a whole stream from the start.
"""

from __future__ import annotations

from collections import OrderedDict


class SampleDeduper:
    """Remembers the last `window` sample ids; `first_time(id)` is True once per id."""

    def __init__(self, window: int = 1_000_000) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.duplicates = 0
        """How many ids were seen again (and dropped by the reader)."""

    def first_time(self, sample_id: str) -> bool:
        """Record `sample_id`; True if it was not among the remembered ids."""
        if sample_id in self._seen:
            self._seen.move_to_end(sample_id)
            self.duplicates += 1
            return False
        self._seen[sample_id] = None
        if len(self._seen) > self.window:
            self._seen.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._seen)
