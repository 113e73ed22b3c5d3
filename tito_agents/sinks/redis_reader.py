"""The consumer side of Redis Streams: a consumer-group reader with ack, stable consumer names,
re-reads after reconnects, and dedupe by `sample_id` (`RedisSeenSet`). See `redis_streams` for
the stream layout and memory."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks._optional import missing
from tito_agents.sinks._redis_consumer import LEASE_TTL, ConsumerLease, derived_name
from tito_agents.sinks.codec import FIELD_META, decode_fields
from tito_agents.sinks.dedupe import SampleDeduper

try:
    import redis
    import redis.exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised only without redis
    raise missing("redis") from exc

from tito_agents.sinks._redis import DEFAULT_STREAM, DEFAULT_URL, connect, translate


class RedisStreamReader:
    """Reads samples from a stream through a consumer group, at least once, duplicates removed.

    `read` returns new samples (first the ones this consumer had read but not acknowledged: after
    a restart, a reconnect or any error of a read; also entries of consumers idle for
    `claim_idle` seconds); `ack` acknowledges them once the trainer is done with them. A trainer
    that crashes before `ack` gets the same samples again as soon as it restarts, because its
    consumer name is stable (`consumer`, `worker`, the launcher's ``RANK`` / ``LOCAL_RANK``, or a
    per-host slot: see `tito_agents.sinks._redis_consumer`). A duplicate (a producer retry) is
    acknowledged and dropped: by the in-memory window, and, with `dedupe_ttl`, by the ids of
    acknowledged samples kept in Redis for at least `dedupe_ttl` seconds (`RedisSeenSet`), so a
    restarted reader also skips copies of samples acknowledged before.

    Stopping: `batches(idle_timeout=…)` waits for what is still pending in the group (its own
    stranded entries are re-read at once, other consumers' are claimed once idle for
    `claim_idle`) before it returns; `close` does not wait, it hands what this reader holds
    unacknowledged back to the group (claimable by any reader at once).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        stream: str = DEFAULT_STREAM,
        group: str = "trainer",
        consumer: str | None = None,
        worker: str | int | None = None,
        client: redis.Redis | None = None,
        start_id: str = "0",
        delete_acked: bool = True,
        claim_idle: float | None = 60.0,
        dedupe_window: int = 1_000_000,
        dedupe_ttl: int | None = 3600,
        dedupe_shards: int = 4096,
        **connect_options: Any,
    ) -> None:
        if consumer is not None and worker is not None:
            raise ConfigurationError("give consumer= or worker=, not both")
        self.stream = stream
        self.group = group
        self.delete_acked = delete_acked
        self.claim_idle = claim_idle
        self.dedupe_ttl = dedupe_ttl
        self.deduper = SampleDeduper(dedupe_window)
        self._owns_client = client is None
        self.client = client if client is not None else connect(url, **connect_options)
        self.seen = (
            RedisSeenSet(self.client, f"{stream}:seen", dedupe_ttl, dedupe_shards)
            if dedupe_ttl is not None
            else None
        )
        self._consumer = consumer
        self._lease: ConsumerLease | None = None
        if consumer is None:
            base, per_host = derived_name(group, worker)
            self._lease = ConsumerLease(self.client, stream, group, base, per_host)
        self._lease_renewed = 0.0
        self._start_id = start_id
        self._group_ready = False
        self._pending_cursor: str | None = "0"  # re-read our own unacknowledged entries first
        self._entry_ids: dict[str, list[bytes]] = {}
        self._last_claim = 0.0
        self._draining = False
        self.duplicates_dropped = 0
        self.rereads = 0
        """How many times this reader went back over its own pending entries after an error or
        a reconnect (entries Redis had delivered in a reply that never arrived)."""

    def __repr__(self) -> str:
        return f"RedisStreamReader(stream={self.stream!r}, group={self.group!r})"

    @property
    def consumer(self) -> str:
        """This reader's consumer name in the group (a derived name is leased from Redis on first
        use, so this may raise a retryable `SinkError` while Redis is unreachable)."""
        if self._consumer is None:
            assert self._lease is not None
            try:
                self._consumer = self._lease.acquire()
            except redis_errors.RedisError as exc:
                raise translate(exc, f"consumer lease on {self.stream!r}") from exc
            self._lease_renewed = time.monotonic()
        return self._consumer

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.stream, self.group, id=self._start_id, mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _renew_lease(self) -> None:
        if self._lease is not None and time.monotonic() - self._lease_renewed > LEASE_TTL / 4:
            self._lease.renew()
            self._lease_renewed = time.monotonic()

    def read(self, max_samples: int = 64, timeout: float | None = 1.0) -> list[Sample]:
        """Up to `max_samples` new samples, waiting up to `timeout` seconds (None: forever) for
        the first. Raises `SinkError(retryable=True)` while Redis is unreachable; the next read
        then starts over this consumer's pending entries (a reply lost with the connection may
        have delivered entries that never reached us)."""
        try:
            consumer = self.consumer
            self._ensure_group()
            self._renew_lease()
            entries = self._read_pending(consumer, max_samples)
            if not entries:
                entries = self._claim_stale(consumer, max_samples)
            if not entries:
                entries = self._read_new(consumer, max_samples, timeout)
            return self._accept(entries)
        except redis_errors.RedisError as exc:
            self._reread_pending()
            if isinstance(exc, redis_errors.ResponseError) and "NOGROUP" in str(exc):
                self._group_ready = False  # the stream was deleted (or Redis lost it): recreate
            raise translate(exc, f"XREADGROUP {self.stream!r}") from exc
        except SinkError:
            self._reread_pending()
            raise

    def _reread_pending(self) -> None:
        if self._pending_cursor != "0":
            self.rereads += 1
        self._pending_cursor = "0"

    def _read_pending(self, consumer: str, max_samples: int) -> list[Any]:
        if self._pending_cursor is None:
            return []
        reply: Any = self.client.xreadgroup(
            self.group, consumer, {self.stream: self._pending_cursor}, count=max_samples
        )
        entries = reply[0][1] if reply else []
        if entries:
            self._pending_cursor = entries[-1][0].decode()
        else:
            self._pending_cursor = None
        return list(entries)

    def _read_new(self, consumer: str, max_samples: int, timeout: float | None) -> list[Any]:
        """XREADGROUP ">" and, in the same round trip, XPENDING: if Redis counts more entries
        pending for this consumer than it holds, a reply was lost (redis-py retried a read
        over a new connection, or Redis restarted) and the pending entries are re-read next."""
        block = 0 if timeout is None else max(1, int(timeout * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.xreadgroup(self.group, consumer, {self.stream: ">"}, count=max_samples, block=block)
        pipe.xpending(self.stream, self.group)
        reply, summary = pipe.execute()
        entries = list(reply[0][1]) if reply else []
        if self._own_pending(summary, consumer) > self._held() + len(entries):
            self._reread_pending()
        return entries

    @staticmethod
    def _own_pending(summary: Any, consumer: str) -> int:
        for row in summary.get("consumers") or []:
            name = row["name"]
            if (name.decode() if isinstance(name, bytes) else str(name)) == consumer:
                return int(row["pending"])
        return 0

    def _held(self) -> int:
        return sum(len(entry_ids) for entry_ids in self._entry_ids.values())

    def _claim_stale(self, consumer: str, max_samples: int) -> list[Any]:
        if self.claim_idle is None:
            return []
        if not self._draining and time.monotonic() - self._last_claim < self.claim_idle / 2:
            return []
        self._last_claim = time.monotonic()
        reply: Any = self.client.xautoclaim(
            self.stream,
            self.group,
            consumer,
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
            held = self._entry_ids.get(sample.sample_id)
            if held is not None:
                if entry_id not in held:  # a copy of one we hold unacknowledged
                    held.append(entry_id)
                    self.duplicates_dropped += 1
                continue  # (else: re-read of our own pending entry, already handed out)
            fresh.append((entry_id, sample))
        if fresh and self.seen is not None:
            flags = self.seen.contains([s.sample_id for _, s in fresh])
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
            if self.seen is not None:
                self.seen.add(pipe, sample_ids)
            pipe.xack(self.stream, self.group, *ids)
            if self.delete_acked:
                pipe.xdel(self.stream, *ids)
            pipe.execute()
        except redis_errors.RedisError as exc:
            self._reread_pending()
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

    def pending_elsewhere(self) -> int:
        """Entries of the group pending but not held by this reader: its own that a lost reply
        stranded (they are re-read next), and, when `claim_idle` is set, other consumers' (they
        are claimed once idle, or acknowledged by their holder). `batches` waits for these."""
        try:
            summary: Any = self.client.xpending(self.stream, self.group)
        except redis_errors.RedisError as exc:
            self._reread_pending()
            raise translate(exc, f"XPENDING {self.stream!r}") from exc
        own = self._own_pending(summary, self.consumer)
        stranded = max(0, own - self._held())
        if stranded:
            self._reread_pending()
        others = int(summary.get("pending") or 0) - own if self.claim_idle is not None else 0
        return stranded + max(0, others)

    def batches(
        self,
        max_samples: int = 64,
        *,
        idle_timeout: float | None = None,
        auto_ack: bool = True,
        poll: float = 1.0,
        retry_delay: float = 0.5,
        wait_pending: bool = True,
    ) -> Iterator[list[Sample]]:
        """Yield batches until nothing arrives for `idle_timeout` seconds (None: forever).

        With `auto_ack`, a batch is acknowledged when the consumer asks for the next one (so a
        crash while processing a batch re-delivers it). Redis outages are waited out. With
        `wait_pending`, an idle reader returns only once nothing of the group is pending
        elsewhere (`pending_elsewhere`): entries a lost reply stranded under its own name are
        re-read at once, other consumers' are claimed as soon as they have been idle for
        `claim_idle` (checked every `poll` while waiting), so stopping can take up to
        `claim_idle` longer; a run that ends this way leaves no sample unread.
        """
        idle_since = time.monotonic()
        previous: list[Sample] = []
        try:
            while True:
                try:
                    if auto_ack and previous:
                        self.ack(previous)
                        previous = []
                    batch = self.read(max_samples, timeout=poll)
                    if not batch and (
                        idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout
                    ):
                        if not wait_pending or self.pending_elsewhere() == 0:
                            return
                        self._draining = True  # claim on every poll until nothing is pending
                except SinkError as exc:
                    if not exc.retryable:
                        raise
                    time.sleep(retry_delay)
                    continue
                if batch:
                    idle_since = time.monotonic()
                    previous = batch
                    yield batch
        finally:
            self._draining = False

    @property
    def unacknowledged(self) -> int:
        """Samples returned by `read` and not yet acknowledged."""
        return len(self._entry_ids)

    def close(self) -> None:
        """Hand back what this reader holds unacknowledged and free its consumer name. The entries
        stay pending under this name (a reader restarted with it reads them at once) but are
        marked idle, so that any other reader claims them at its next claim check instead of
        after `claim_idle`. Best effort: with Redis unreachable, they are claimed after
        `claim_idle` as usual. Idempotent."""
        ids: list[Any] = [e for entry_ids in self._entry_ids.values() for e in entry_ids]
        self._entry_ids.clear()
        try:
            if ids and self._consumer is not None and self._group_ready:
                self.client.xclaim(
                    self.stream,
                    self.group,
                    self._consumer,
                    min_idle_time=0,
                    message_ids=ids,
                    idle=_HANDED_BACK_IDLE_MS,
                    justid=True,
                )
            if self._lease is not None:
                self._lease.release()
        except redis_errors.RedisError:
            pass
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> RedisStreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_HANDED_BACK_IDLE_MS = 10 * 365 * 24 * 3600 * 1000
"""The idle time `close` sets on entries it hands back: longer than any `claim_idle`."""


class RedisSeenSet:
    """The ids of acknowledged samples, kept in Redis for at least `ttl` seconds (at most 2 ttl),
    so that any reader of the group, restarted or not, drops a copy that arrives later.

    Why not one key per id (as before): a key costs ≈ 133 bytes of Redis memory (measured with
    INFO used_memory on redis-server 7.0; MEMORY USAGE says 88 for the key alone), ≈ 190 MB at
    400 samples/s for a 1 h TTL. Here an id is a 64-bit digest (blake2b of the sample id) stored
    as an integer member of a set: key ``<prefix>:<generation>:<shard>`` with generation =
    server time // ttl and shard = digest mod `shards`. Sets of at most 512 integers (Redis's
    default set-max-intset-entries) are stored as packed arrays: ≈ 9 bytes per id, plus ≈ 100
    bytes per (generation, shard) key. Memory ≈ (1 to 2) × rate × ttl × 9 B + ≤ 2 × shards ×
    100 B; compact while rate × ttl ≤ 512 × shards (2.1 M ids per ttl with the default 4096
    shards), beyond which a shard becomes a hash table (≈ 64 B per id, still half the old cost).
    A generation key expires when the next generation ends, and a lookup checks the current and
    the previous generation. The chance that an unrelated id shares a digest with one
    remembered (and is dropped) is about n / 2⁶⁴ per sample, n the ids remembered.
    """

    def __init__(self, client: redis.Redis, prefix: str, ttl: int, shards: int = 4096) -> None:
        if ttl < 1 or shards < 1:
            raise ConfigurationError("dedupe_ttl and dedupe_shards must be >= 1")
        self.client = client
        self.prefix = prefix
        self.ttl = ttl
        self.shards = shards
        self._clock_offset: float | None = None

    def _now(self) -> float:
        """Redis's clock (read once), so that readers on hosts whose clocks differ agree on the
        generation."""
        if self._clock_offset is None:
            before = time.time()
            seconds, micros = self.client.time()
            self._clock_offset = seconds + micros / 1e6 - (before + time.time()) / 2
        return time.time() + self._clock_offset

    @staticmethod
    def digest(sample_id: str) -> int:
        raw = hashlib.blake2b(sample_id.encode(), digest_size=8).digest()
        return int.from_bytes(raw, "big", signed=True)

    def _key(self, generation: int, shard: int) -> str:
        return f"{self.prefix}:{generation}:{shard}"

    def contains(self, sample_ids: Sequence[str]) -> list[bool]:
        """Whether each id was acknowledged within the last `ttl` seconds (or a little more)."""
        generation = int(self._now() // self.ttl)
        by_shard: dict[int, list[int]] = {}
        digests = [self.digest(sample_id) for sample_id in sample_ids]
        for value in digests:
            by_shard.setdefault(value % self.shards, []).append(value)
        pipe = self.client.pipeline(transaction=False)
        order: list[int] = []
        for shard, values in by_shard.items():
            for gen in (generation, generation - 1):
                pipe.smismember(self._key(gen, shard), values)
                order.append(shard)
        seen: set[int] = set()
        for shard, flags in zip(order, pipe.execute(), strict=True):
            seen.update(v for v, flag in zip(by_shard[shard], flags, strict=True) if flag)
        return [value in seen for value in digests]

    def add(self, pipe: Any, sample_ids: Sequence[str]) -> None:
        """Queue on `pipe` the commands that remember `sample_ids` (so that they are applied in
        the same MULTI/EXEC as the acknowledgement)."""
        generation = int(self._now() // self.ttl)
        by_shard: dict[int, list[int]] = {}
        for sample_id in sample_ids:
            value = self.digest(sample_id)
            by_shard.setdefault(value % self.shards, []).append(value)
        expire_at = (generation + 2) * self.ttl
        for shard, values in by_shard.items():
            key = self._key(generation, shard)
            pipe.sadd(key, *values)
            pipe.expireat(key, expire_at)
