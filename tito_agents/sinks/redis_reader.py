"""The consumer side of Redis Streams: a consumer-group reader with ack, stable consumer names
(`_redis_consumer`), re-reads after reconnects, and dedupe by `sample_id` (`RedisSeenSet`, in
`dedupe`). `batches` waits out outages (`RedisUnreachableError` past a limit): that loop lives in
`_redis_batches`. See `redis_streams` for the stream layout."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks._optional import missing
from tito_agents.sinks._redis_batches import BatchLoop, RedisUnreachableError
from tito_agents.sinks._redis_consumer import LEASE_TTL, ConsumerLease, derived_name
from tito_agents.sinks.codec import FIELD_META, decode_fields
from tito_agents.sinks.dedupe import RedisSeenSet, SampleDeduper

try:
    import redis
    import redis.exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised only without redis
    raise missing("redis") from exc

from tito_agents.sinks._redis import DEFAULT_STREAM, DEFAULT_URL, connect, translate

__all__ = ["RedisSeenSet", "RedisStreamReader", "RedisUnreachableError"]

logger = logging.getLogger("tito_agents.sinks")


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
        self._loop = BatchLoop()  # what `batches` keeps between calls (counters, draining)
        self.duplicates_dropped = 0
        self.acks_without_seen = 0
        """Samples acknowledged while Redis was out of memory, their ids not kept in the seen set
        (see `ack`)."""
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
        except redis_errors.OutOfMemoryError:
            if not self._group_exists():  # Redis full refuses XGROUP CREATE even of a group
                raise  # that exists; reading (and acknowledging) frees memory
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def _group_exists(self) -> bool:
        try:
            groups: Any = self.client.xinfo_groups(self.stream)
        except redis_errors.ResponseError:  # no such stream
            return False
        names = [g["name"] for g in groups]
        return any((n.decode() if isinstance(n, bytes) else n) == self.group for n in names)

    def _renew_lease(self) -> None:
        if self._lease is not None and time.monotonic() - self._lease_renewed > LEASE_TTL / 4:
            try:
                self._lease.renew()
            except redis_errors.OutOfMemoryError:
                return  # Redis is full: read (and free memory by acknowledging); renew later
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
        over a new connection, or Redis restarted) and the pending entries are re-read next.

        Each XREADGROUP blocks for at most half the client's socket timeout (`_block_cap`), and
        longer waits (`timeout` None: forever) are several of them: a healthy Redis with nothing
        to read answers each in time, so that idleness never reads as an outage."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cap = self._block_cap()
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = left if cap is None else cap if left is None else min(left, cap)
            block = 0 if wait is None else max(1, int(wait * 1000))
            pipe = self.client.pipeline(transaction=False)
            pipe.xreadgroup(
                self.group, consumer, {self.stream: ">"}, count=max_samples, block=block
            )
            pipe.xpending(self.stream, self.group)
            reply, summary = pipe.execute()
            entries = list(reply[0][1]) if reply else []
            if self._own_pending(summary, consumer) > self._held() + len(entries):
                self._reread_pending()
                return entries
            if entries or wait == left:  # something came, or this wait reached the deadline
                return entries

    def _block_cap(self) -> float | None:
        """The longest one XREADGROUP may block: half the socket timeout of the client's
        connections (None: they have none), leaving the reply the other half to arrive."""
        socket_timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        return None if not socket_timeout else float(socket_timeout) / 2

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
        if not self._loop.draining and time.monotonic() - self._last_claim < self.claim_idle / 2:
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
        acknowledged. Acknowledged entries are deleted when `delete_acked`.

        The acknowledgement and the write of the ids to the seen set (`dedupe_ttl`) are one
        MULTI/EXEC. Redis out of memory (``maxmemory``, ``noeviction``) refuses every command
        queued in a MULTI, though acknowledging and deleting free memory: then the entries are
        deleted and acknowledged without MULTI and without the seen-set write (counted in
        `acks_without_seen`, logged). The cost: a copy of one of these samples (a producer retry)
        that arrives after this reader is gone is not recognised as a duplicate by a new reader;
        while this reader lives, its in-memory window (`dedupe_window`) still drops it."""
        ids: list[bytes] = []
        sample_ids: list[str] = []
        for item in samples:
            sample_id = item if isinstance(item, str) else item.sample_id
            ids.extend(self._entry_ids.get(sample_id, []))
            sample_ids.append(sample_id)
        if not ids:
            return 0
        try:
            if not self._ack_ids(ids, sample_ids) and self.seen is not None:
                self.acks_without_seen += len(sample_ids)
        except redis_errors.RedisError as exc:
            self._reread_pending()
            raise translate(exc, f"XACK {self.stream!r}") from exc
        for sample_id in sample_ids:
            self._entry_ids.pop(sample_id, None)
        return len(ids)

    def _ack_ids(self, ids: list[bytes], sample_ids: list[str] | None = None) -> bool:
        """XACK (and XDEL) `ids` in one MULTI, with the seen-set write of `sample_ids`; False when
        Redis was out of memory and they were acknowledged without MULTI and without that write."""
        try:
            pipe = self.client.pipeline(transaction=True)
            if sample_ids and self.seen is not None:
                self.seen.add(pipe, sample_ids)
            pipe.xack(self.stream, self.group, *ids)
            if self.delete_acked:
                pipe.xdel(self.stream, *ids)
            pipe.execute()
        except redis_errors.OutOfMemoryError as exc:
            self._ack_out_of_memory(ids, exc)
            return False
        return True

    def _ack_out_of_memory(self, ids: list[bytes], exc: Exception) -> None:
        """Acknowledge (and delete) `ids` without MULTI, which Redis refuses when out of memory.
        XDEL goes first: if only it is applied, the entry stays pending with no fields, and the
        next read of the pending entries acknowledges it (see `_accept`); nothing is read twice."""
        logger.warning("%r: Redis out of memory: acknowledging without MULTI: %s", self, exc)
        pipe = self.client.pipeline(transaction=False)
        if self.delete_acked:
            pipe.xdel(self.stream, *ids)
        pipe.xack(self.stream, self.group, *ids)
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
        unreachable_timeout: float | None = 300.0,
    ) -> Iterator[list[Sample]]:
        """Yield batches until Redis has answered with nothing for `idle_timeout` seconds (None:
        forever).

        With `auto_ack`, a batch is acknowledged when the consumer asks for the next one (so a
        crash while processing a batch re-delivers it). A reader that cannot reach Redis is not
        idle: `idle_timeout` counts only time while Redis answers (its clock starts over when
        Redis answers again, when producers may still be catching up). Meanwhile the reader
        retries every `retry_delay` seconds (logged; counted in `unreachable_retries` and
        `outages`) and raises `RedisUnreachableError` once Redis has been unreachable for
        `unreachable_timeout` seconds in a row (None: retries forever); a non-retryable error
        (credentials, permissions) raises at once. With `wait_pending`, an idle reader returns
        only once nothing of the group is pending elsewhere (`pending_elsewhere`): entries a lost
        reply stranded under its own name are re-read at once, other consumers' are claimed as
        soon as they have been idle for `claim_idle` (checked every `poll` while waiting), so
        stopping can take up to `claim_idle` longer; a run that ends this way leaves no sample
        unread.
        """
        return self._loop.run(
            self,
            max_samples,
            idle_timeout=idle_timeout,
            auto_ack=auto_ack,
            poll=poll,
            retry_delay=retry_delay,
            wait_pending=wait_pending,
            unreachable_timeout=unreachable_timeout,
        )

    @property
    def unreachable_retries(self) -> int:
        """Failed tries of `batches` while Redis was unreachable (or answered "try again")."""
        return self._loop.retries

    @property
    def outages(self) -> int:
        """Outages `batches` waited out (or raised on): runs of failed tries."""
        return self._loop.outages

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
