"""Duplicate removal by `sample_id` for at-least-once transports (Redis Streams, Ray, spill replay).

Retries make a sample arrive twice; readers drop the second copy so that what a trainer sees is
exactly once. The memory is bounded: only the most recent `window` ids are remembered, which covers
every retry (retries resend recent samples), not a replay of a whole stream from the start.
`RedisSeenSet` keeps the ids of acknowledged samples in Redis, for readers that restart.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tito_agents.errors import ConfigurationError

if TYPE_CHECKING:  # redis-py is an extra: this module imports without it
    import redis


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


class RedisSeenSet:
    """The ids of acknowledged samples, kept in Redis for at least `ttl` seconds (at most 2 ttl),
    so that any reader of the group, restarted or not, drops a copy that arrives later.

    Why not one key per id: a key costs ≈ 133 bytes of Redis memory (measured with
    INFO used_memory on redis-server 7.0; MEMORY USAGE says 88 for the key alone), ≈ 190 MB at
    400 samples/s for a 1 h TTL. Here an id is a 64-bit digest (blake2b of the sample id) stored
    as an integer member of a set: key ``<prefix>:<generation>:<shard>`` with generation =
    server time // ttl and shard = digest mod `shards`. Sets of at most 512 integers (Redis's
    default set-max-intset-entries) are stored as packed arrays: ≈ 9 bytes per id, plus ≈ 100
    bytes per (generation, shard) key. Memory ≈ (1 to 2) × rate × ttl × 9 B + ≤ 2 × shards ×
    100 B; compact while rate × ttl ≤ 512 × shards (2.1 M ids per ttl with the default 4096
    shards), beyond which a shard becomes a hash table (≈ 64 B per id, still half a key per id).
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
