"""The loop of `RedisStreamReader.batches`: when a reader stops, and how it waits out an outage.

Kept apart from the reader (`redis_reader`: reading, acknowledging, the consumer name) because its
concern is time rather than Redis commands: an empty answer from a Redis that answers is idleness
(`idle_timeout`); a failed try is an outage, retried, logged and counted, and given up on with
`RedisUnreachableError` only past its own limit; and stopping first waits for what is still pending
elsewhere in the group. The loop sees the reader through `BatchReader`, the three public methods it
calls, so it depends on no reader module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

from tito_agents.errors import SinkError
from tito_agents.samples import Sample

logger = logging.getLogger("tito_agents.sinks")
_clock = time.monotonic
"""The clock of `BatchLoop.run` (idle and outage time); tests replace it to make an outage long."""


class RedisUnreachableError(SinkError):
    """`batches` could not reach Redis for `unreachable_timeout` seconds (`seconds`, over
    `attempts` tries). Nothing was lost: unread samples stay in the stream, unacknowledged ones
    pending for this consumer; a reader started again (same name) reads them."""

    def __init__(self, message: str, *, seconds: float, attempts: int) -> None:
        super().__init__(message, retryable=True)
        self.seconds = seconds
        self.attempts = attempts


class BatchReader(Protocol):
    """What the loop calls on a reader (`RedisStreamReader`'s public methods of these names)."""

    def read(self, max_samples: int = ..., timeout: float | None = ...) -> list[Sample]: ...

    def ack(self, samples: Sequence[Sample | str]) -> int: ...

    def pending_elsewhere(self) -> int: ...


class BatchLoop:
    """The state of one reader's `batches` that outlives a call: the outage counters, whether it
    is draining, and the tries of the outage under way (reset only once Redis answers again)."""

    def __init__(self) -> None:
        self.retries = 0
        """Failed tries while Redis was unreachable (or answered "try again")."""
        self.outages = 0
        """Outages waited out (or raised on): runs of failed tries."""
        self.draining = False
        """True while an idle loop waits for entries pending elsewhere: the reader then claims
        other consumers' idle entries on every read instead of every `claim_idle / 2`."""
        self._outage_tries = 0

    def run(
        self,
        reader: BatchReader,
        max_samples: int,
        *,
        idle_timeout: float | None,
        auto_ack: bool,
        poll: float,
        retry_delay: float,
        wait_pending: bool,
        unreachable_timeout: float | None,
    ) -> Iterator[list[Sample]]:
        """`RedisStreamReader.batches` (its docstring says what each argument does)."""
        idle_since = _clock()
        down_since: float | None = None
        previous: list[Sample] = []
        try:
            while True:
                asked = _clock()
                try:
                    if auto_ack and previous:
                        reader.ack(previous)
                        previous = []
                    batch = reader.read(max_samples, timeout=poll)
                    if down_since is not None:  # idle from the first answer after an outage
                        self._back_up(reader, down_since)
                        idle_since, down_since = asked, None
                    if not batch and (
                        idle_timeout is not None and _clock() - idle_since >= idle_timeout
                    ):
                        if not wait_pending or reader.pending_elsewhere() == 0:
                            return
                        self.draining = True  # claim on every poll until nothing is pending
                except SinkError as exc:
                    if not exc.retryable:
                        raise
                    down_since = self._unreachable(reader, exc, down_since, unreachable_timeout)
                    time.sleep(retry_delay)
                    continue
                if batch:
                    idle_since = _clock()
                    previous = batch
                    yield batch
        finally:
            self.draining = False

    def _unreachable(
        self, reader: BatchReader, exc: SinkError, since: float | None, limit: float | None
    ) -> float:
        """Count and log a failed try; raise once Redis has been unreachable for `limit`
        seconds. Returns when the outage began."""
        now = _clock()
        self.retries += 1
        if since is None:
            since = now
            self.outages += 1
            logger.warning(
                "%r: Redis unreachable, not idle: retrying (for up to %s): %s",
                reader,
                "ever" if limit is None else f"{limit:g}s",
                exc,
            )
        else:
            logger.debug("%r: Redis still unreachable after %.1fs: %s", reader, now - since, exc)
        self._outage_tries += 1
        if limit is not None and now - since >= limit:
            raise RedisUnreachableError(
                f"{reader!r}: Redis unreachable for {now - since:.1f}s ({self._outage_tries} tries,"
                f" unreachable_timeout={limit:g}); nothing is lost, unread samples wait in Redis:"
                f" {exc}",
                seconds=now - since,
                attempts=self._outage_tries,
            ) from exc
        return since

    def _back_up(self, reader: BatchReader, since: float) -> None:
        tries, self._outage_tries = self._outage_tries, 0
        logger.warning(
            "%r: Redis answers again after %.1fs, %d tries", reader, _clock() - since, tries
        )
