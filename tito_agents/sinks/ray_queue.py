"""Ray: a sink that ships batches of samples to a named queue actor, and the trainer-side reader.

Inside a Ray cluster (verl, OpenRLHF, SkyRL, slime, NeMo RL) samples travel through the object
store. `RaySink` puts each batch (up to `batch_size` samples or `batch_bytes`) into the object
store with one `ray.put`, and hands the references (not the data) of all batches of one `write`
to a named, detached `SampleQueueActor` (`ray_actor`) in one small actor call. `RayReader`s lease
batches from the actor and fetch them. Per-sample overhead is a fraction of a `ray.put` (a
`ray.util.queue` put per sample costs about a millisecond).

Bounded: the actor holds at most `capacity` samples; a producer never has more than `capacity`
samples sent and not yet consumed, and `write` waits (backpressure) beyond that.

Ownership (Ray frees an object when the process that put it dies): batches are owned by the
producer while it runs, so the hot path is one `ray.put`. `close()` hands every batch not yet read
to the actor (`adopt`: the actor copies it and owns the copy), so the samples outlive the producer
and the driver. A producer that crashes without `close` may lose the batches no reader had taken
(readers count and log them as `lost_batches`); `adopt="eager"` makes the actor copy every batch
on arrival instead, which closes that window at the cost of a second copy.

Faults: every batch a producer sent stays referenced by the producer until a reader has
acknowledged it. If the actor dies (killed, node lost) the producer re-creates it (same name) and
re-sends the references; a batch a reader had already taken may arrive twice, and the reader drops
the copy by `sample_id`, so the trainer sees each sample once. A batch leased to a reader that dies
before acknowledging goes back to the queue after `lease_timeout` seconds. After `close`, the
actor holds the only copy (it outlives the producer, not the loss of its node or cluster).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import lifecycle
from tito_agents.sinks.base import Sink
from tito_agents.sinks.dedupe import SampleDeduper
from tito_agents.sinks.ray_actor import (  # raises the install hint without ray
    DEFAULT_NAME,
    DEFAULT_NAMESPACE,
    BatchItem,
    ensure_ray,
    queue_actor,
    ray,
    ray_errors,
    split_batches,
)

__all__ = ["DEFAULT_NAME", "DEFAULT_NAMESPACE", "RayReader", "RaySink", "queue_actor"]

logger = logging.getLogger("tito_agents.sinks")

_ACTOR_GONE = (ray_errors.RayActorError, ray_errors.ActorHandleNotFoundError)


@dataclass(slots=True)
class _Sent:
    refs: list[Any]
    """`[ObjectRef]` of the batch, owned by this producer."""
    count: int
    accepted_op: int | None = None
    """The actor's operation number when it accepted this batch (None: not accepted yet)."""


class RaySink(Sink):
    """Ships samples in batches to the `SampleQueueActor` called `name` (see the module docstring).

    address / init_options: used only if Ray is not initialized yet in this process.
    capacity: samples the actor holds (when this sink creates it) and samples this producer keeps
        sent-but-unconsumed before `write` waits.
    batch_size / batch_bytes: the most samples / array bytes per `ray.put` (an actor call costs
        about as much as putting a few MB, so batches are large and one call carries every batch
        of a `write`). max_inflight: actor calls awaiting a reply before `write` waits.
    recover_timeout: seconds to keep trying to reach or re-create the actor before raising
        `SinkError(retryable=True)`.
    adopt: "close" (default): the actor takes ownership of unread batches at `close`; "eager":
        on arrival (survives a producer crash; costs a copy per batch).
    """

    def __init__(
        self,
        name: str = DEFAULT_NAME,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        address: str | None = None,
        capacity: int = 1024,
        batch_size: int = 256,
        batch_bytes: int = 32 * 1024 * 1024,
        max_inflight: int = 16,
        lease_timeout: float = 60.0,
        recover_timeout: float = 30.0,
        adopt: str = "close",
        **init_options: Any,
    ) -> None:
        if adopt not in ("close", "eager"):
            raise ConfigurationError('adopt must be "close" or "eager"')
        ensure_ray(address, **init_options)
        self.eager = adopt == "eager"
        self.name = name
        self.namespace = namespace
        self.capacity = capacity
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.max_inflight = max_inflight
        self.lease_timeout = lease_timeout
        self.recover_timeout = recover_timeout
        self.producer = uuid.uuid4().hex
        self._actor = self._connect()
        self._incarnation: str | None = None
        self._seq = 0
        self._sent: OrderedDict[int, _Sent] = OrderedDict()
        self._unsubmitted: list[int] = []
        self._inflight: dict[Any, list[int]] = {}
        self._closed = False
        self.samples_written = 0
        self.batches_sent = 0
        self.actor_calls = 0
        self.resent_batches = 0
        self.actor_restarts = 0
        self.backpressure_waits = 0
        lifecycle.track(self)

    def __repr__(self) -> str:
        return f"RaySink({self.namespace}/{self.name})"

    def _connect(self) -> Any:
        return queue_actor(
            self.name,
            namespace=self.namespace,
            capacity=self.capacity,
            lease_timeout=self.lease_timeout,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unconsumed(self) -> int:
        """Samples sent and not yet acknowledged by a reader (kept for re-sending)."""
        return sum(s.count for s in self._sent.values())

    # ---- writing ----

    def write(self, samples: Sequence[Sample]) -> None:
        """Put samples into the object store in batches and hand them to the actor in one call;
        returns once submitted (`flush` waits until the actor holds them). Waits while
        `capacity` samples are unconsumed."""
        if self._closed:
            raise SinkError(f"{self!r} is closed", retryable=False)
        for batch in split_batches(samples, self.batch_size, self.batch_bytes):
            self._wait_for_room(len(batch))
            try:
                ref = ray.put([s.to_dict() for s in batch])
            except ray_errors.RayError as exc:
                self._submit_pending()
                raise SinkError(f"{self!r}: ray.put failed: {exc}", retryable=True) from exc
            seq = self._seq
            self._seq += 1
            self._sent[seq] = _Sent([ref], len(batch))
            self._unsubmitted.append(seq)
            self.samples_written += len(batch)
            self.batches_sent += 1
        self._submit_pending()

    def _submit_pending(self) -> None:
        seqs, self._unsubmitted = self._unsubmitted, []
        if seqs:
            self._submit(seqs)

    def _submit(self, seqs: list[int]) -> None:
        items: list[BatchItem] = [
            (seq, self._sent[seq].refs, self._sent[seq].count) for seq in seqs if seq in self._sent
        ]
        if not items:
            return
        floor = next(iter(self._sent))  # the oldest batch not yet consumed
        try:
            future = self._actor.put.remote(self.producer, items, self.eager, floor)
        except _ACTOR_GONE:
            self._recover()
            return
        self.actor_calls += 1
        self._inflight[future] = [seq for seq, _, _ in items]
        while len(self._inflight) >= self.max_inflight:
            self._harvest(wait_all=False)

    def _wait_for_room(self, count: int) -> None:
        if not self._sent or self.unconsumed + count <= self.capacity:
            return
        self._submit_pending()  # the actor must have them before readers can free room
        self.backpressure_waits += 1
        delay = 0.005
        while self._sent and self.unconsumed + count > self.capacity:
            if self._inflight:
                self._harvest(wait_all=False, timeout=delay)
            else:
                self._refresh_status()
                time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _harvest(self, *, wait_all: bool, timeout: float | None = None) -> None:
        """Collect actor replies: drop consumed batches, re-send refused ones, recover if gone."""
        futures = list(self._inflight)
        if not futures:
            return
        ready, _ = ray.wait(futures, num_returns=len(futures) if wait_all else 1, timeout=timeout)
        refused: list[int] = []
        for future in ready:
            seqs = self._inflight.pop(future)
            try:
                reply = ray.get(future)
            except _ACTOR_GONE:
                self._recover()
                return
            for seq, accepted in zip(seqs, reply["accepted"], strict=True):
                if not accepted:
                    refused.append(seq)
                elif seq in self._sent:
                    self._sent[seq].accepted_op = reply["op"]
            if self._note_reply(reply):
                return  # a new incarnation: everything was re-sent
        if refused:
            self.backpressure_waits += 1
            time.sleep(0.01)
            self._submit(sorted(refused))

    def _note_reply(self, reply: dict[str, Any]) -> bool:
        """Apply a reply's view of the actor; True if the actor was re-created (and re-fed)."""
        incarnation = reply["incarnation"]
        if self._incarnation is not None and incarnation != self._incarnation:
            logger.warning("%r: queue actor was re-created; re-sending unconsumed batches", self)
            self._incarnation = incarnation
            self._resend_all()
            return True
        self._incarnation = incarnation
        # A batch the actor had accepted by the time of this reply and no longer holds was
        # acknowledged by a reader.
        held, op = set(reply["held"]), reply["op"]
        for seq, sent in list(self._sent.items()):
            if sent.accepted_op is not None and sent.accepted_op <= op and seq not in held:
                del self._sent[seq]
        return False

    def _refresh_status(self) -> None:
        try:
            reply = ray.get(self._actor.status.remote(self.producer), timeout=self.recover_timeout)
        except _ACTOR_GONE:
            self._recover()
            return
        except ray_errors.GetTimeoutError as exc:
            raise SinkError(f"{self!r}: queue actor does not answer", retryable=True) from exc
        self._note_reply(reply)

    def _recover(self) -> None:
        """Re-create the actor (same name) and re-send every unconsumed batch."""
        deadline = time.monotonic() + self.recover_timeout
        delay = 0.05
        while True:
            try:
                self._actor = self._connect()
                reply = ray.get(self._actor.status.remote(self.producer), timeout=10)
                break
            except (ray_errors.RayError, ValueError) as exc:
                if time.monotonic() >= deadline:
                    msg = f"{self!r}: cannot reach the queue actor: {exc}"
                    raise SinkError(msg, retryable=True) from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self.actor_restarts += 1
        logger.warning("%r: queue actor was gone; re-sending %d samples", self, self.unconsumed)
        self._incarnation = reply["incarnation"]
        self._resend_all()

    def _resend_all(self) -> None:
        self._inflight.clear()
        self._unsubmitted.clear()
        for sent in self._sent.values():
            sent.accepted_op = None
        self.resent_batches += len(self._sent)
        self._submit(list(self._sent))

    # ---- flush / close ----

    def flush(self) -> None:
        """Return once the actor holds every batch sent so far (re-creating it if it died)."""
        self._submit_pending()
        if not self._inflight:
            self._refresh_status()  # idle: make sure the actor still holds what it took
        while self._inflight or any(s.accepted_op is None for s in self._sent.values()):
            if not self._inflight:
                self._submit([seq for seq, s in self._sent.items() if s.accepted_op is None])
                continue
            self._harvest(wait_all=True, timeout=self.recover_timeout)

    def close(self) -> None:
        """Flush, then hand unread batches over to the actor (which keeps them for readers after
        this process exits). Idempotent."""
        if self._closed:
            return
        self.flush()
        for attempt in range(3):
            try:
                ray.get(self._actor.adopt.remote(self.producer), timeout=self.recover_timeout)
                break
            except _ACTOR_GONE:
                if attempt == 2:
                    raise
                self._recover()
                self.flush()
            except ray_errors.GetTimeoutError as exc:
                msg = f"{self!r}: queue actor did not adopt in time"
                raise SinkError(msg, retryable=True) from exc
        self._closed = True
        self._sent.clear()

    def close_at_exit(self, timeout: float) -> str:
        if not ray.is_initialized():
            return f"Ray was shut down first; {self.unconsumed} unread samples were not handed over"
        pending = self.unconsumed
        self.close()
        return f"handed {pending} unread samples over to the queue actor"

    async def awrite(self, samples: Sequence[Sample]) -> None:
        await asyncio.to_thread(self.write, samples)

    async def aflush(self) -> None:
        await asyncio.to_thread(self.flush)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


class RayReader:
    """Takes samples from the queue actor `name` (created if absent), duplicates removed.

    `read` leases batches, fetches them and acknowledges them to the actor right away (the data is
    then in this process). A reader that dies between fetch and acknowledgement leaves its lease
    to expire (`lease_timeout`); the batches are then served again.
    """

    def __init__(
        self,
        name: str = DEFAULT_NAME,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        address: str | None = None,
        capacity: int = 1024,
        lease_timeout: float = 60.0,
        dedupe_window: int = 1_000_000,
        **init_options: Any,
    ) -> None:
        ensure_ray(address, **init_options)
        self.name = name
        self.namespace = namespace
        self.capacity = capacity
        self.lease_timeout = lease_timeout
        self.deduper = SampleDeduper(dedupe_window)
        self._actor = self._connect()
        self.actor_restarts = 0
        self.lost_batches = 0
        """Batches whose producer died before handing them over (logged as errors)."""

    def _connect(self) -> Any:
        return queue_actor(
            self.name,
            namespace=self.namespace,
            capacity=self.capacity,
            lease_timeout=self.lease_timeout,
        )

    def read(self, max_samples: int = 64, timeout: float | None = 1.0) -> list[Sample]:
        """Up to about `max_samples` samples (whole batches), waiting up to `timeout` seconds."""
        try:
            leased = ray.get(self._actor.get.remote(max_samples, timeout))
        except _ACTOR_GONE:
            self.actor_restarts += 1
            logger.warning("queue actor %s/%s is gone; re-creating it", self.namespace, self.name)
            self._actor = self._connect()
            return []
        samples: list[Sample] = []
        for batch_id, refs in leased:
            try:
                payload = ray.get(refs[0])
            except ray_errors.ObjectLostError as exc:
                self.lost_batches += 1
                logger.error(
                    "batch %s of queue %s/%s is lost (its producer died before close): %s",
                    batch_id,
                    self.namespace,
                    self.name,
                    type(exc).__name__,
                )
                continue
            for data in payload:
                sample = Sample.from_dict(_own_arrays(data))
                if self.deduper.first_time(sample.sample_id):
                    samples.append(sample)
        if leased:
            self._actor.ack.remote([batch_id for batch_id, _ in leased])
        return samples

    @property
    def duplicates_dropped(self) -> int:
        return self.deduper.duplicates

    def batches(
        self, max_samples: int = 64, *, idle_timeout: float | None = None, poll: float = 1.0
    ) -> Iterator[list[Sample]]:
        """Yield batches until nothing arrives for `idle_timeout` seconds (None: forever)."""
        idle_since = time.monotonic()
        while True:
            batch = self.read(max_samples, timeout=poll)
            if batch:
                idle_since = time.monotonic()
                yield batch
            elif idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return

    def stats(self) -> dict[str, Any]:
        """The actor's counters: queued, leased, accepted and acknowledged samples."""
        result: dict[str, Any] = ray.get(self._actor.stats.remote())
        return result


def _own_arrays(data: dict[str, Any]) -> dict[str, Any]:
    """Copy the arrays out of the object store (writable, and independent of its lifetime)."""
    out = dict(data)
    for key in ("token_ids", "loss_mask", "logprobs", "policy_logprobs"):
        value = out.get(key)
        if value is not None:
            out[key] = value.copy()
    return out
