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
samples is acceptable, or with several consumer groups (then set `delete_acked=False`).

Durability: a sample is safe in Redis once `write` returns, as far as Redis itself is durable: run
it with ``appendonly yes`` (``appendfsync always`` loses nothing on a Redis crash, ``everysec`` up
to a second) to keep samples across a Redis restart.

Auth and TLS: ``redis://user:password@host:6379/0``, ``rediss://`` for TLS, or the `username`,
`password`, `ssl_*` arguments (passed to redis-py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks._optional import missing
from tito_agents.sinks.base import Sink
from tito_agents.sinks.codec import FIELD_META, decode_fields, encode_fields
from tito_agents.sinks.dedupe import SampleDeduper

try:
    import redis
    import redis.exceptions as redis_errors
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without redis
    raise missing("redis") from exc

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_STREAM = "tito:samples"
_SID = b"sid"
_TRANSIENT_REPLIES = ("OOM", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY")


def connect(
    url: str = DEFAULT_URL,
    *,
    username: str | None = None,
    password: str | None = None,
    ssl_ca_certs: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    ssl_cert_reqs: str = "required",
    ssl_check_hostname: bool = True,
    socket_timeout: float | None = 10.0,
    connect_timeout: float | None = 5.0,
) -> redis.Redis:
    """A redis-py client for `url` (``redis://``, ``rediss://`` = TLS, ``unix://``).

    redis-py retries a failed command once, quickly; longer outages surface as retryable
    `SinkError`s, so the caller's own backoff (`BufferedSink`) decides how long to wait.
    """
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 1),
    }
    if username is not None:
        kwargs["username"] = username
    if password is not None:
        kwargs["password"] = password
    if url.startswith("rediss://"):
        kwargs.update(
            ssl_ca_certs=ssl_ca_certs,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            ssl_cert_reqs=ssl_cert_reqs,
            ssl_check_hostname=ssl_check_hostname,
        )
    elif any(v is not None for v in (ssl_ca_certs, ssl_certfile, ssl_keyfile)):
        raise ConfigurationError("TLS options need a rediss:// URL")
    return redis.Redis.from_url(url, **kwargs)


def translate(exc: Exception, what: str) -> SinkError:
    """A redis-py error as a `SinkError` that knows whether retrying can help."""
    if isinstance(exc, redis_errors.AuthenticationError | redis_errors.AuthorizationError):
        return SinkError(f"{what}: Redis refused the credentials: {exc}", retryable=False)
    if isinstance(exc, redis_errors.NoPermissionError):
        return SinkError(f"{what}: the Redis user lacks a permission: {exc}", retryable=False)
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
        return SinkError(f"{what}: Redis unreachable: {exc}", retryable=True)
    if isinstance(exc, redis_errors.ResponseError):
        transient = str(exc).upper().startswith(_TRANSIENT_REPLIES)
        return SinkError(f"{what}: Redis error: {exc}", retryable=transient)
    return SinkError(f"{what}: {type(exc).__name__}: {exc}", retryable=False)


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


class RedisStreamReader:
    """Reads samples from a stream through a consumer group, at least once, duplicates removed.

    `read` returns new samples (first, after a restart, the ones this consumer had read but not
    acknowledged; also entries of consumers idle for `claim_idle` seconds); `ack` acknowledges
    them once the trainer is done with them. A trainer that crashes before `ack` gets the same
    samples again. A duplicate (a producer retry) is acknowledged and dropped: by the in-memory
    window, and, with `dedupe_ttl`, by a Redis key set at `ack`, so a restarted reader also
    skips copies of samples acknowledged before.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        stream: str = DEFAULT_STREAM,
        group: str = "trainer",
        consumer: str | None = None,
        client: redis.Redis | None = None,
        start_id: str = "0",
        delete_acked: bool = True,
        claim_idle: float | None = 60.0,
        dedupe_window: int = 1_000_000,
        dedupe_ttl: int | None = 3600,
        **connect_options: Any,
    ) -> None:
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.delete_acked = delete_acked
        self.claim_idle = claim_idle
        self.dedupe_ttl = dedupe_ttl
        self.deduper = SampleDeduper(dedupe_window)
        self._owns_client = client is None
        self.client = client if client is not None else connect(url, **connect_options)
        self._start_id = start_id
        self._group_ready = False
        self._pending_cursor: str | None = "0"  # re-read our own unacknowledged entries first
        self._entry_ids: dict[str, list[bytes]] = {}
        self._last_claim = 0.0
        self.duplicates_dropped = 0

    def __repr__(self) -> str:
        return f"RedisStreamReader(stream={self.stream!r}, group={self.group!r})"

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.stream, self.group, id=self._start_id, mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def read(self, max_samples: int = 64, timeout: float | None = 1.0) -> list[Sample]:
        """Up to `max_samples` new samples, waiting up to `timeout` seconds (None: forever) for
        the first. Raises `SinkError(retryable=True)` while Redis is unreachable."""
        try:
            self._ensure_group()
            entries = self._read_pending(max_samples)
            if not entries:
                entries = self._claim_stale(max_samples)
            if not entries:
                block = 0 if timeout is None else max(1, int(timeout * 1000))
                reply: Any = self.client.xreadgroup(
                    self.group, self.consumer, {self.stream: ">"}, count=max_samples, block=block
                )
                entries = reply[0][1] if reply else []
            return self._accept(entries)
        except redis_errors.RedisError as exc:
            if isinstance(exc, redis_errors.ResponseError) and "NOGROUP" in str(exc):
                self._group_ready = False  # the stream was deleted (or Redis lost it): recreate
            raise translate(exc, f"XREADGROUP {self.stream!r}") from exc

    def _read_pending(self, max_samples: int) -> list[Any]:
        if self._pending_cursor is None:
            return []
        reply: Any = self.client.xreadgroup(
            self.group, self.consumer, {self.stream: self._pending_cursor}, count=max_samples
        )
        entries = reply[0][1] if reply else []
        if entries:
            self._pending_cursor = entries[-1][0].decode()
        else:
            self._pending_cursor = None
        return list(entries)

    def _claim_stale(self, max_samples: int) -> list[Any]:
        if self.claim_idle is None or time.monotonic() - self._last_claim < self.claim_idle / 2:
            return []
        self._last_claim = time.monotonic()
        reply: Any = self.client.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            min_idle_time=int(self.claim_idle * 1000),
            count=max_samples,
        )
        return list(reply[1]) if reply else []

    def _accept(self, entries: list[Any]) -> list[Sample]:
        """Decode entries, dropping (and acknowledging) duplicates and deleted entries."""
        fresh: list[tuple[bytes, Sample]] = []
        drop: list[bytes] = []
        for entry_id, fields in entries:
            if not fields or FIELD_META not in fields:
                drop.append(entry_id)  # deleted after it was delivered to us
                continue
            sample = decode_fields(fields)
            if sample.sample_id in self._entry_ids:  # a copy of one we hold unacknowledged
                self._entry_ids[sample.sample_id].append(entry_id)
                self.duplicates_dropped += 1
                continue
            fresh.append((entry_id, sample))
        if fresh and self.dedupe_ttl is not None:
            flags = self._seen_flags([self._seen_key(s.sample_id) for _, s in fresh])
            for (entry_id, _), was_seen in zip(fresh, flags, strict=True):
                if was_seen:
                    drop.append(entry_id)
                    self.duplicates_dropped += 1
            fresh = [pair for pair, was_seen in zip(fresh, flags, strict=True) if not was_seen]
        out: list[Sample] = []
        for entry_id, sample in fresh:
            if self.deduper.first_time(sample.sample_id):
                self._entry_ids[sample.sample_id] = [entry_id]
                out.append(sample)
            else:
                drop.append(entry_id)
                self.duplicates_dropped += 1
        if drop:
            self._ack_ids(drop)
        return out

    def _seen_flags(self, keys: list[str]) -> list[bool]:
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.exists(key)
        return [bool(v) for v in pipe.execute()]

    def _seen_key(self, sample_id: str) -> str:
        return f"{self.stream}:seen:{sample_id}"

    def ack(self, samples: Sequence[Sample | str]) -> int:
        """Acknowledge samples (or sample ids) returned by `read`; returns how many entries were
        acknowledged. Acknowledged entries are deleted when `delete_acked`."""
        ids: list[bytes] = []
        sample_ids: list[str] = []
        for item in samples:
            sample_id = item if isinstance(item, str) else item.sample_id
            ids.extend(self._entry_ids.get(sample_id, []))
            sample_ids.append(sample_id)
        if not ids:
            return 0
        try:
            pipe = self.client.pipeline(transaction=True)
            if self.dedupe_ttl is not None:
                for sample_id in sample_ids:
                    pipe.set(self._seen_key(sample_id), b"1", ex=self.dedupe_ttl)
            pipe.xack(self.stream, self.group, *ids)
            if self.delete_acked:
                pipe.xdel(self.stream, *ids)
            pipe.execute()
        except redis_errors.RedisError as exc:
            raise translate(exc, f"XACK {self.stream!r}") from exc
        for sample_id in sample_ids:
            self._entry_ids.pop(sample_id, None)
        return len(ids)

    def _ack_ids(self, ids: list[bytes]) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(self.stream, self.group, *ids)
        if self.delete_acked:
            pipe.xdel(self.stream, *ids)
        pipe.execute()

    def batches(
        self,
        max_samples: int = 64,
        *,
        idle_timeout: float | None = None,
        auto_ack: bool = True,
        poll: float = 1.0,
        retry_delay: float = 0.5,
    ) -> Iterator[list[Sample]]:
        """Yield batches until nothing arrives for `idle_timeout` seconds (None: forever).

        With `auto_ack`, a batch is acknowledged when the consumer asks for the next one (so a
        crash while processing a batch re-delivers it). Redis outages are waited out.
        """
        idle_since = time.monotonic()
        previous: list[Sample] = []
        while True:
            try:
                if auto_ack and previous:
                    self.ack(previous)
                    previous = []
                batch = self.read(max_samples, timeout=poll)
            except SinkError as exc:
                if not exc.retryable:
                    raise
                time.sleep(retry_delay)
                continue
            if batch:
                idle_since = time.monotonic()
                previous = batch
                yield batch
            elif idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                if auto_ack and previous:
                    self.ack(previous)
                return

    @property
    def unacknowledged(self) -> int:
        """Samples returned by `read` and not yet acknowledged."""
        return len(self._entry_ids)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> RedisStreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
