"""`RedisStreamReader.batches` through a Redis outage, against a real redis-server killed and
restarted by the test: a reader that cannot reach Redis is not idle (it neither returns as if the
stream were drained nor loses anything), and it gives up with a typed error only after its own,
separate limit.

Timing decides nothing here: the test drives the outage (kill, restart), waits on the reader's
counters, and makes the outage long on the reader's clock (`_redis_batches._clock`, the clock of
the `batches` loop) instead of sleeping through it."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tito_agents.samples import Sample
from tito_agents.sinks.harness import LocalRedisServer, synthetic_sample

pytest.importorskip("redis", reason="redis-py not installed (pip install redis)")
if shutil.which("redis-server") is None:
    pytest.skip(
        "redis-server not installed (apt-get install redis-server)", allow_module_level=True
    )

from tests.support.redis_reading import drain
from tito_agents.sinks import _redis_batches
from tito_agents.sinks.redis_streams import (
    RedisStreamReader,
    RedisStreamSink,
    RedisUnreachableError,
)

IDLE = 60.0
"""idle_timeout, in seconds of the reader's clock: far above any real pause of the test, so only
the outage (made long on that clock) could exceed it."""


class Clock:
    """The reader's clock: real monotonic time plus what the test adds (a long outage, at once)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(_redis_batches, "_clock", fake)
    return fake


@pytest.fixture
def server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def make(n: int, start: int = 0) -> list[Sample]:
    return [synthetic_sample(i, 16) for i in range(start, start + n)]


def ids(samples: list[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


def write(url: str, samples: list[Sample]) -> None:
    with RedisStreamSink(url, stream="outage") as sink:
        sink.write(samples)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Wait for an event the test causes; the deadline only turns a hang into a failure."""
    deadline = time.monotonic() + 60
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.005)


def count_empty_reads(reader: RedisStreamReader) -> list[int]:
    """Count the reads that Redis answered with nothing (wraps `reader.read`)."""
    counter = [0]
    read = reader.read

    def counting(max_samples: int = 64, timeout: float | None = 1.0) -> list[Sample]:
        batch = read(max_samples, timeout)
        counter[0] += not batch
        return batch

    reader.read = counting  # type: ignore[method-assign]
    return counter


def test_an_outage_longer_than_idle_timeout_does_not_end_the_iteration(
    server: LocalRedisServer, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis is killed mid-run and stays down for 10 × idle_timeout (on the reader's clock); it
    comes back with the stream empty (producers still catching up) and the reader keeps waiting:
    the samples written after that are read, every sample exactly once, the outage logged and
    counted. Only then, idle for idle_timeout with Redis answering, does the iteration end."""
    write(server.url, make(5))
    reader = RedisStreamReader(
        server.url, stream="outage", claim_idle=None, socket_timeout=2, connect_timeout=2
    )
    empty_reads = count_empty_reads(reader)
    batches = reader.batches(10, idle_timeout=IDLE, poll=0.05, retry_delay=0.01,
                             unreachable_timeout=100 * IDLE)  # fmt: skip
    got = next(batches)
    assert ids(got) == ids(make(5))
    failures: list[BaseException] = []

    def outage() -> None:
        try:
            wait_for(lambda: reader.unreachable_retries >= 3, "the reader failing to reach Redis")
            clock.offset += 10 * IDLE  # the outage lasts 10 × idle_timeout
            tries = reader.unreachable_retries
            wait_for(lambda: reader.unreachable_retries >= tries + 2, "tries after the long outage")
            empty_before = empty_reads[0]
            server.start()
            wait_for(lambda: empty_reads[0] > empty_before, "an empty read after the restart")
            write(server.url, make(7, start=5))  # the producers' backlog arrives after Redis did
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            server.start()

    server.kill()
    driver = threading.Thread(target=outage)
    with caplog.at_level(logging.DEBUG, logger="tito_agents.sinks"):
        driver.start()
        while len(got) < 12:
            got += next(batches)  # StopIteration here: the reader took the outage for idleness
        driver.join()
        assert not failures, failures
        assert ids(got) == ids(make(12))
        assert reader.outages == 1 and reader.unreachable_retries >= 5
        clock.offset += IDLE  # idle, with Redis answering, for idle_timeout: the iteration ends
        assert next(batches, None) is None
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("Redis unreachable, not idle" in m for m in messages)
    assert any("Redis answers again" in m for m in messages)
    reader.close()
    with RedisStreamReader(server.url, stream="outage", claim_idle=0.0) as after:
        assert after.read(20, timeout=0.2) == []  # all acknowledged: nothing left unread


def test_an_outage_longer_than_unreachable_timeout_raises_and_loses_nothing(
    server: LocalRedisServer,
) -> None:
    """Redis down for longer than unreachable_timeout: `batches` raises `RedisUnreachableError`
    (after at least two tries, counted) rather than returning as if drained; the batch it had
    not acknowledged is handed to the same consumer name again once Redis is back."""
    write(server.url, make(4))
    reader = RedisStreamReader(server.url, stream="outage", consumer="c1", claim_idle=None,
                               socket_timeout=2, connect_timeout=2)  # fmt: skip
    batches = reader.batches(10, idle_timeout=IDLE, poll=0.05, retry_delay=0.02,
                             unreachable_timeout=0.3)  # fmt: skip
    assert ids(next(batches)) == ids(make(4))
    server.kill()  # down until the reader gave up: no race with the limit
    with pytest.raises(RedisUnreachableError) as caught:
        next(batches)
    assert caught.value.retryable and caught.value.seconds >= 0.3
    assert caught.value.attempts >= 2 and reader.unreachable_retries == caught.value.attempts
    assert reader.outages == 1
    server.start()
    reader.close()
    with RedisStreamReader(server.url, stream="outage", consumer="c1", claim_idle=None) as again:
        assert ids(drain(again, 4, timeout=10)) == ids(make(4))
        assert again.read(10, timeout=0.2) == []
