"""The Ray queue actor behind `RaySink` / `RayReader`: a bounded FIFO of sample batches.

Batches arrive by reference (`[ObjectRef]`, never the data), are served to readers in each
producer's order, leased until a reader acknowledges them, and counted against `capacity`.
One actor per queue name, detached, so it outlives the processes that use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tito_agents.samples import Sample
from tito_agents.sinks._optional import missing
from tito_agents.sinks.codec import sample_nbytes

try:
    import ray
    import ray.exceptions as ray_errors
except ImportError as exc:  # pragma: no cover - exercised only without ray
    raise missing("ray") from exc

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_NAMESPACE",
    "BatchItem",
    "SampleQueueActor",
    "ensure_ray",
    "queue_actor",
    "ray",
    "ray_errors",
    "split_batches",
]

DEFAULT_NAME = "tito-samples"
DEFAULT_NAMESPACE = "tito"

BatchItem = tuple[int, list[Any], int]
"""(seq, [ObjectRef], sample count): one batch as a producer sends it."""


@dataclass(slots=True)
class _Held:
    batch_id: str
    producer: str
    seq: int
    refs: list[Any]
    """`[ObjectRef]`: wrapped in a list so Ray passes the reference instead of the value."""
    count: int
    adopted: bool = False
    """True once the actor owns its own copy (the batch then survives its producer)."""


class SampleQueueActor:
    """The queue (an async actor). Every method is quick; only `get` waits, for new batches.

    Ray does not keep the order of calls to an async actor, so each producer numbers its batches
    (`seq`, contiguous from 0) and they are served in that order: a batch that arrives early waits
    for its predecessors. `floor` (the producer's oldest unconsumed batch) is where an actor that
    was re-created starts. The next batch in order is never refused, so waiting batches cannot
    block the queue.
    """

    def __init__(self, capacity: int, lease_timeout: float) -> None:
        self.incarnation = uuid.uuid4().hex
        self.capacity = capacity
        self.lease_timeout = lease_timeout
        self._queue: deque[_Held] = deque()
        self._leased: dict[str, tuple[float, _Held]] = {}
        self._waiting: dict[str, dict[int, _Held]] = {}
        self._next_seq: dict[str, int] = {}
        self._samples = 0
        self._accepted = 0
        self._acked = 0
        self._op = 0
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()

    def _producer_batches(self, producer: str) -> list[_Held]:
        held = [h for h in self._queue if h.producer == producer]
        held += [h for _, h in self._leased.values() if h.producer == producer]
        held += list(self._waiting.get(producer, {}).values())
        return held

    def _reply(self, producer: str, accepted: list[bool]) -> dict[str, Any]:
        """What a producer learns: which batches were taken, and which it sent are still here
        (`op` orders replies, so a late reply cannot make it forget a batch too early)."""
        self._op += 1
        return {
            "op": self._op,
            "accepted": accepted,
            "incarnation": self.incarnation,
            "held": [h.seq for h in self._producer_batches(producer)],
        }

    async def put(
        self, producer: str, items: list[BatchItem], adopt: bool = False, floor: int = 0
    ) -> dict[str, Any]:
        """Take batches by reference; a batch is refused while the queue is full."""
        expected = max(self._next_seq.get(producer, floor), floor)
        self._next_seq[producer] = expected
        waiting = self._waiting.setdefault(producer, {})
        accepted: list[bool] = []
        fresh: list[_Held] = []
        for seq, refs, count in items:
            if seq < self._next_seq[producer] or seq in waiting:
                accepted.append(True)  # a re-send of a batch already here
                continue
            full = self._samples and self._samples + count > self.capacity
            if full and seq != self._next_seq[producer]:
                accepted.append(False)
                continue
            held = _Held(uuid.uuid4().hex, producer, seq, list(refs), count)
            waiting[seq] = held
            self._samples += count
            self._accepted += count
            fresh.append(held)
            accepted.append(True)
            self._release_in_order(producer)
        if adopt:
            for held in fresh:
                await self._adopt_one(held)
        await self._notify()
        return self._reply(producer, accepted)

    def _release_in_order(self, producer: str) -> None:
        waiting = self._waiting[producer]
        expected = self._next_seq[producer]
        while expected in waiting:
            self._queue.append(waiting.pop(expected))
            expected += 1
        self._next_seq[producer] = expected

    async def status(self, producer: str) -> dict[str, Any]:
        return self._reply(producer, [])

    async def _adopt_one(self, held: _Held) -> None:
        if not held.adopted:
            value = await held.refs[0]
            held.refs = [ray.put(value)]
            held.adopted = True

    async def adopt(self, producer: str) -> int:
        """Copy the producer's unread batches into objects this actor owns; returns samples."""
        batches = self._producer_batches(producer)
        for held in batches:
            await self._adopt_one(held)
        return sum(h.count for h in batches)

    def _requeue_expired(self) -> None:
        now = time.monotonic()
        expired = [bid for bid, (deadline, _) in self._leased.items() if deadline <= now]
        for batch_id in expired:
            _, held = self._leased.pop(batch_id)
            self._queue.appendleft(held)

    async def get(self, max_samples: int, timeout: float | None) -> list[tuple[str, list[Any]]]:
        """Lease batches (at least one, about `max_samples` samples), waiting up to `timeout`."""
        changed = self._condition()
        deadline = None if timeout is None else time.monotonic() + timeout
        async with changed:
            while True:
                self._requeue_expired()
                if self._queue:
                    break
                remaining = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if remaining <= 0:
                    return []
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        out: list[tuple[str, list[Any]]] = []
        taken = 0
        lease_until = time.monotonic() + self.lease_timeout
        while self._queue and (not out or taken + self._queue[0].count <= max_samples):
            held = self._queue.popleft()
            self._leased[held.batch_id] = (lease_until, held)
            out.append((held.batch_id, held.refs))
            taken += held.count
        return out

    async def ack(self, batch_ids: list[str]) -> int:
        """Forget batches a reader has taken; their samples stop counting against capacity."""
        done = 0
        for batch_id in batch_ids:
            entry = self._leased.pop(batch_id, None)
            if entry is not None:
                self._samples -= entry[1].count
                self._acked += entry[1].count
                done += entry[1].count
        await self._notify()
        return done

    async def stats(self) -> dict[str, Any]:
        waiting = sum(h.count for w in self._waiting.values() for h in w.values())
        return {
            "incarnation": self.incarnation,
            "queued_samples": sum(h.count for h in self._queue) + waiting,
            "leased_samples": sum(h.count for _, h in self._leased.values()),
            "accepted": self._accepted,
            "acked": self._acked,
            "capacity": self.capacity,
        }


_actor_class: Any = None


def ensure_ray(address: str | None = None, **init_options: Any) -> None:
    """Connect to Ray if this process is not connected yet (`address` None: start or join the
    local cluster, as `ray.init` does)."""
    if not ray.is_initialized():
        ray.init(address=address, **init_options)


def queue_actor(
    name: str = DEFAULT_NAME,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    capacity: int = 1024,
    lease_timeout: float = 60.0,
) -> Any:
    """The named queue actor, created (detached, no CPU reserved) if it does not exist."""
    global _actor_class
    if _actor_class is None:
        _actor_class = ray.remote(SampleQueueActor)
    return _actor_class.options(
        name=name,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_concurrency=64,
    ).remote(capacity, lease_timeout)


def split_batches(
    samples: Sequence[Sample], max_samples: int, max_bytes: int
) -> Iterator[Sequence[Sample]]:
    """Consecutive batches of at most `max_samples` samples and about `max_bytes` array bytes
    (a batch always holds at least one sample)."""
    start = size = 0
    for index, sample in enumerate(samples):
        nbytes = sample_nbytes(sample)
        if index > start and (index - start >= max_samples or size + nbytes > max_bytes):
            yield samples[start:index]
            start, size = index, 0
        size += nbytes
    if start < len(samples):
        yield samples[start:]
