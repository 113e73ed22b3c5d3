"""The in-process asyncio queue sink: bounded memory, backpressure or spill, draining close."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.queue import AsyncQueueSink


def make(n: int, start: int = 0) -> list[Sample]:
    return [synthetic_sample(i, 16) for i in range(start, start + n)]


def ids(samples: list[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


async def test_a_slow_consumer_slows_producers() -> None:
    """With the default policy a full queue makes awrite wait: memory never passes maxsize."""
    sink = AsyncQueueSink(maxsize=4)
    high_water = 0

    async def produce() -> None:
        nonlocal high_water
        for i in range(20):
            await sink.awrite(make(1, start=i))
            high_water = max(high_water, sink.qsize)
        await sink.aclose()

    got: list[Sample] = []

    async def consume() -> None:
        async for sample in sink:
            got.append(sample)
            await asyncio.sleep(0.002)

    await asyncio.gather(produce(), consume())
    assert ids(got) == ids(make(20))
    assert high_water <= 4
    assert sink.backpressure_waits > 0


async def test_spill_mode_never_blocks_and_keeps_order(tmp_path: Path) -> None:
    """With spill_dir a full queue spills instead of waiting; the consumer gets everything in
    order, memory stays bounded."""
    sink = AsyncQueueSink(maxsize=3, spill_dir=tmp_path)
    for i in range(10):
        await asyncio.wait_for(sink.awrite(make(1, start=i)), timeout=1)
        assert sink.qsize <= 3
    assert sink.spilled == 7 and sink.pending == 10
    await sink.awrite(make(1, start=10))  # still spilling: order is kept
    got = await sink.get_batch(100, timeout=1)
    while len(got) < 11:
        got += await sink.get_batch(100, timeout=1)
    assert ids(got) == ids(make(11))
    await sink.aclose(timeout=1)
    assert not list(tmp_path.rglob("*.spill"))


async def test_get_batch_times_out_empty() -> None:
    """get_batch returns [] after its timeout when nothing arrives."""
    sink = AsyncQueueSink()
    assert await sink.get_batch(8, timeout=0.05) == []
    await sink.aclose(timeout=0)


async def test_aclose_waits_for_the_consumer_to_drain() -> None:
    """aclose returns once the consumer has taken every sample; writes after close fail."""
    sink = AsyncQueueSink(maxsize=10)
    await sink.awrite(make(5))
    closing = asyncio.create_task(sink.aclose())
    await asyncio.sleep(0.05)
    assert not closing.done()
    got = await sink.get_batch(10)
    await asyncio.wait_for(closing, 30)
    assert len(got) == 5 and sink.pending == 0
    with pytest.raises(SinkError, match="closed"):
        await sink.awrite(make(1))
    with pytest.raises(SinkError, match="closed and drained"):
        await sink.get()


async def test_write_from_another_thread_waits_for_room() -> None:
    """Sync write from a worker thread blocks on a full queue like awrite, without blocking the
    loop."""
    sink = AsyncQueueSink(maxsize=2)
    await sink.awrite(make(2))
    loop = asyncio.get_running_loop()
    finished = threading.Event()

    def worker() -> None:
        sink.write(make(2, start=2))
        finished.set()

    thread_done = loop.run_in_executor(None, worker)
    await asyncio.sleep(0.1)
    assert not finished.is_set()
    first = await sink.get_batch(2)
    await asyncio.wait_for(thread_done, 30)
    second = await sink.get_batch(2, timeout=1)
    assert ids(first + second) == ids(make(4))
    await sink.aclose(timeout=1)


async def test_write_on_the_loop_thread_never_deadlocks() -> None:
    """Sync write on the loop thread cannot wait: when the queue is full it raises (or spills)."""
    sink = AsyncQueueSink(maxsize=2)
    sink.write(make(2))
    with pytest.raises(SinkError, match=r"use `await sink\.awrite") as caught:
        sink.write(make(1, start=2))
    assert caught.value.retryable
    assert ids(await sink.get_batch(5)) == ids(make(2))
    await sink.aclose(timeout=1)


async def test_bound_counts_bytes_too() -> None:
    """max_bytes bounds memory for long samples as well as the sample count."""
    sink = AsyncQueueSink(maxsize=100, max_bytes=3 * 1000, spill_dir=None)
    big = [synthetic_sample(i, 200) for i in range(5)]  # ~1.4 KB each
    await sink.awrite(big[:2])
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(sink.awrite(big[2:4]), 0.1)
    assert sink.qsize == 2
    await sink.get_batch(10)
    await sink.aclose(timeout=0)
