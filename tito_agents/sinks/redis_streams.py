"""Redis Streams: a sink that XADDs one entry per sample, and a consumer-group reader with ack.

Each sample is one stream entry, written by one XADD (so Redis stores a sample whole or not at
all): ``sid`` (the sample id), ``meta`` (a small JSON header) and the raw arrays ``token_ids``
(int32), ``loss_mask`` (uint8), ``logprobs`` (float32, absent when not captured); see `codec`.
No JSON lists: about 9 bytes per token, sent from the numpy buffers without a copy. A batch is one
pipelined round trip (`transaction=True` makes it a MULTI/EXEC: all of the batch or none of it,
at some cost to throughput). A batch retried after a lost reply may be stored twice; the reader
removes the second copy by `sample_id`.

Memory: Redis keeps the stream in RAM. By default the reader deletes entries once acknowledged
(`delete_acked=True`), so the stream holds only unread or unacknowledged samples, and the sink
applies backpressure when it holds `max_backlog` entries (write waits, then raises a retryable
error, which a `BufferedSink` turns into buffering and spilling). `maxlen` trimming (XADD MAXLEN ~)
is available but deletes the oldest entries whether read or not: use it only if losing unread
samples is acceptable, or with several consumer groups (then set `delete_acked=False`). The other
thing the reader keeps in Redis is the ids of acknowledged samples, for `dedupe_ttl`: about 9 bytes
per id, rate × ttl × 9 B (see `RedisSeenSet`).

Durability: a sample is safe in Redis once `write` returns, as far as Redis itself is durable: run
it with ``appendonly yes`` (``appendfsync always`` loses nothing on a Redis crash, ``everysec`` up
to a second) to keep samples across a Redis restart.

Auth and TLS: ``redis://user:password@host:6379/0``, ``rediss://`` for TLS, or the `username`,
`password`, `ssl_*` arguments (passed to redis-py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks._optional import missing
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import encode_fields

try:
    import redis
    import redis.exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised only without redis
    raise missing("redis") from exc

from tito_agents.sinks._redis import _SID, DEFAULT_STREAM, DEFAULT_URL, connect, translate
from tito_agents.sinks.redis_reader import RedisSeenSet, RedisStreamReader, RedisUnreachableError

__all__ = [
    "DEFAULT_STREAM",
    "DEFAULT_URL",
    "RedisSeenSet",
    "RedisStreamReader",
    "RedisStreamSink",
    "RedisUnreachableError",
    "connect",
    "translate",
]


class RedisStreamSink(Sink):
    """Appends samples to a Redis stream (see the module docstring).

    `client` may be given instead of a URL (the sink then does not close it). `batch_size`: samples
    per round trip (`transaction=True`: per MULTI/EXEC). `max_backlog`: entries in the stream at
    which `write` waits (up to `backlog_timeout` seconds) for readers to catch up; None disables
    the check.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        stream: str = DEFAULT_STREAM,
        client: redis.Redis | None = None,
        maxlen: int | None = None,
        approximate: bool = True,
        max_backlog: int | None = 100_000,
        backlog_timeout: float = 30.0,
        batch_size: int = 64,
        transaction: bool = False,
        **connect_options: Any,
    ) -> None:
        self.stream = stream
        self.transaction = transaction
        self.maxlen = maxlen
        self.approximate = approximate
        self.max_backlog = max_backlog
        self.backlog_timeout = backlog_timeout
        self.batch_size = batch_size
        self._owns_client = client is None
        self.client = client if client is not None else connect(url, **connect_options)
        self._backlog = 0
        self.samples_written = 0
        self.backpressure_waits = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisStreamSink(stream={self.stream!r})"

    def write(self, samples: Sequence[Sample]) -> None:
        """Store every sample (one XADD each, one round trip per `batch_size`); returns once
        Redis has applied them, or raises `SinkError` (retryable for outages; some samples of the
        failed batch may be stored already, and a retry stores them again: readers dedupe)."""
        if self._closed:
            raise SinkError(f"{self!r} is closed", retryable=False)
        for start in range(0, len(samples), self.batch_size):
            self._wait_for_backlog()
            self._write_batch(samples[start : start + self.batch_size])

    def _write_batch(self, batch: Sequence[Sample]) -> None:
        try:
            pipe = self.client.pipeline(transaction=self.transaction)
            for sample in batch:
                fields: dict[Any, Any] = {_SID: sample.sample_id.encode()}
                fields.update(encode_fields(sample))
                pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=self.approximate)
            if self.max_backlog is not None:
                pipe.xlen(self.stream)
            replies = pipe.execute()
        except redis_errors.RedisError as exc:
            raise translate(exc, f"XADD to {self.stream!r}") from exc
        if self.max_backlog is not None:
            self._backlog = int(replies[-1])
        self.samples_written += len(batch)

    def _wait_for_backlog(self) -> None:
        if self.max_backlog is None or self._backlog < self.max_backlog:
            return
        self.backpressure_waits += 1
        deadline = time.monotonic() + self.backlog_timeout
        delay = 0.01
        while True:
            try:
                self._backlog = int(self.client.xlen(self.stream))
            except redis_errors.RedisError as exc:
                raise translate(exc, f"XLEN {self.stream!r}") from exc
            if self._backlog < self.max_backlog:
                return
            if time.monotonic() >= deadline:
                raise SinkError(
                    f"stream {self.stream!r} holds {self._backlog} unread samples "
                    f"(max_backlog={self.max_backlog}) after {self.backlog_timeout}s: readers "
                    "are behind",
                    retryable=True,
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def awrite(self, samples: Sequence[Sample]) -> None:
        await asyncio.to_thread(self.write, samples)

    def close(self) -> None:
        """Nothing is buffered (each write is applied before it returns); closes the client if
        the sink made it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self.client.close()
