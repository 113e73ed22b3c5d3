"""Redis replies that mean "not now" (a replica before its failover, a full Redis) and a healthy
but idle Redis, against real redis-servers: errors are produced by the server (a second server
started with ``--replicaof`` answers READONLY; one with ``--maxmemory 2mb`` and noeviction, once
filled, answers OOM), never built by hand.

Timing decides nothing: the tests wait on counters (failed tries, XREADGROUP calls) and cause the
recovery (promotion, memory freed) themselves."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tito_agents.samples import Sample
from tito_agents.sinks.harness import LocalRedisServer, synthetic_sample

pytest.importorskip("redis", reason="redis-py not installed (pip install redis)")
if shutil.which("redis-server") is None:
    pytest.skip(
        "redis-server not installed (apt-get install redis-server)", allow_module_level=True
    )

import redis
import redis.exceptions as redis_errors

from tests.support.redis_reading import drain, wait_for
from tito_agents.sinks._redis import translate
from tito_agents.sinks.buffered import Backoff, BufferedSink
from tito_agents.sinks.redis_streams import RedisStreamReader, RedisStreamSink

STREAM = "transient"


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture
def primary() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as srv:
        yield srv


@pytest.fixture
def replica(primary: LocalRedisServer) -> Iterator[LocalRedisServer]:
    """A replica of `primary`: it answers every write with READONLY until promoted."""
    with LocalRedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]) as srv:
        yield srv


@pytest.fixture
def full() -> Iterator[LocalRedisServer]:
    """A Redis with 2 MB of memory and no eviction (filled by `fill`)."""
    with LocalRedisServer(
        extra_args=["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]
    ) as srv:
        yield srv


def make(n: int, start: int = 0) -> list[Sample]:
    return [synthetic_sample(i, 16) for i in range(start, start + n)]


def ids(samples: list[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


def fill(url: str) -> None:
    """Write filler keys until Redis answers OOM, then lower `maxmemory` 128 KB below what Redis
    uses: without that margin, OOM comes and goes with the size of client buffers. `free` (the
    filler, about 1 MB) brings it well below again."""
    client = redis.Redis.from_url(url)
    for i in range(100_000):
        try:
            client.set(f"filler:{i}", b"x" * 1024)
        except redis_errors.OutOfMemoryError:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", used - 128 * 1024)
            return
    raise AssertionError("Redis never ran out of memory")


def free(url: str) -> None:
    client = redis.Redis.from_url(url)
    client.delete(*client.keys("filler:*"))


def promote(server: LocalRedisServer) -> None:
    redis.Redis.from_url(server.url).replicaof("NO", "ONE")


def in_background(action: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


WAYS: dict[str, Callable[[redis.Redis], object]] = {
    "plain": lambda c: c.xadd(STREAM, {"a": b"1"}),
    "pipeline": lambda c: c.pipeline(transaction=False).xadd(STREAM, {"a": b"1"}).execute(),
    "multi": lambda c: c.pipeline(transaction=True).xadd(STREAM, {"a": b"1"}).execute(),
}


@pytest.mark.parametrize("way", WAYS)
def test_readonly_and_oom_replies_are_retryable(
    way: str, replica: LocalRedisServer, full: LocalRedisServer
) -> None:
    """READONLY (a replica) and OOM (a full Redis), from a plain call, a pipeline and a
    MULTI/EXEC: redis-py raises its own classes with the code stripped (and a pipeline prefix);
    all of them are retryable. A real refusal (a wrong type) is not."""
    fill(full.url)
    for url, kind in ((replica.url, redis_errors.ReadOnlyError),
                      (full.url, redis_errors.OutOfMemoryError)):  # fmt: skip
        with pytest.raises(kind) as caught:
            WAYS[way](redis.Redis.from_url(url))
        assert translate(caught.value, "XADD").retryable, caught.value
    with pytest.raises(redis_errors.ResponseError) as wrongtype:
        redis.Redis.from_url(full.url).xlen("filler:0")  # a string key: WRONGTYPE, for good
    assert not translate(wrongtype.value, "XLEN").retryable


@pytest.mark.parametrize("transaction", [False, True], ids=["pipeline", "multi"])
@pytest.mark.parametrize("cause", ["readonly", "oom"])
def test_a_producer_retries_through_a_failover_or_a_full_redis(
    cause: str,
    transaction: bool,
    replica: LocalRedisServer,
    full: LocalRedisServer,
    tmp_path: Path,
) -> None:
    """A `BufferedSink` over `RedisStreamSink` writing to a replica (READONLY) or a full Redis
    (OOM) keeps retrying, rejects nothing, and delivers every sample once the replica is
    promoted or memory is freed."""
    server = replica if cause == "readonly" else full
    if cause == "oom":
        fill(full.url)
    inner = RedisStreamSink(server.url, stream=STREAM, transaction=transaction)
    sink = BufferedSink(inner, spill_dir=tmp_path, retry=Backoff(initial=0.01, maximum=0.05))
    sink.write(make(3))
    wait_for(lambda: sink.stats.failed_attempts >= 2, "failed deliveries")
    assert sink.stats.rejected == 0 and sink.rejected_samples == []
    promote(server) if cause == "readonly" else free(server.url)
    sink.flush(timeout=30)
    sink.close()
    assert sink.stats.rejected == 0 and not any((tmp_path / "rejected").glob("*"))
    with RedisStreamReader(server.url, stream=STREAM, consumer="c", claim_idle=None) as reader:
        assert ids(drain(reader, 3)) == ids(make(3))


def test_a_reader_on_a_replica_waits_for_the_failover(
    primary: LocalRedisServer, replica: LocalRedisServer
) -> None:
    """`batches` on a replica (every write of the reader answered READONLY: lease, group,
    XREADGROUP) counts failed tries as an outage instead of raising, and reads the samples once
    the replica is promoted."""
    with RedisStreamSink(primary.url, stream=STREAM) as sink:
        sink.write(make(4))
    replica_client = redis.Redis.from_url(replica.url)
    wait_for(lambda: replica_client.xlen(STREAM) == 4, "the replica to copy the stream")
    reader = RedisStreamReader(replica.url, stream=STREAM, claim_idle=None)
    batches = reader.batches(10, idle_timeout=60, poll=0.05, retry_delay=0.01,
                             unreachable_timeout=None)  # fmt: skip

    def failover() -> None:
        wait_for(lambda: reader.unreachable_retries >= 2, "the reader's failed tries")
        promote(replica)

    thread, failures = in_background(failover)
    got = next(batches)
    thread.join()
    assert not failures, failures
    assert ids(got) == ids(make(4))
    assert reader.outages == 1 and reader.unreachable_retries >= 2
    reader.close()


def test_a_reader_of_a_full_redis_waits_then_reads_and_frees_memory(
    full: LocalRedisServer,
) -> None:
    """Redis full: a new reader cannot take its consumer lease (a write): `batches` counts the
    OOM replies as an outage instead of raising. With an explicit consumer name it reads and
    acknowledges under OOM (XDEL + XACK without MULTI and without the seen-set write), freeing
    the memory the stream held."""
    with RedisStreamSink(full.url, stream=STREAM) as sink:
        sink.write(make(6))
    client = redis.Redis.from_url(full.url)
    client.xgroup_create(STREAM, "trainer", id="0")
    fill(full.url)

    reader = RedisStreamReader(full.url, stream=STREAM, consumer="c", claim_idle=None)
    got: list[Sample] = []
    for batch in reader.batches(2, idle_timeout=0.2, poll=0.05, unreachable_timeout=1.0):
        got += batch
    assert ids(got) == ids(make(6))
    assert reader.acks_without_seen == 6 and reader.outages == 0
    assert client.xlen(STREAM) == 0 and client.xpending(STREAM, "trainer")["pending"] == 0
    assert not client.keys(f"{STREAM}:seen*")
    reader.close()

    with RedisStreamSink(full.url, stream=STREAM) as sink:
        with pytest.raises(Exception) as refused:
            sink.write(make(1, start=6))
        assert getattr(refused.value, "retryable", False)  # still full: OOM, retryable
    leased = RedisStreamReader(full.url, stream=STREAM, claim_idle=None)
    batches = leased.batches(10, idle_timeout=60, poll=0.05, retry_delay=0.01,
                             unreachable_timeout=None)  # fmt: skip

    def make_room() -> None:
        wait_for(lambda: leased.unreachable_retries >= 2, "the reader's failed tries")
        free(full.url)
        with RedisStreamSink(full.url, stream=STREAM) as sink:
            sink.write(make(1, start=6))

    thread, failures = in_background(make_room)
    got = next(batches)
    thread.join()
    assert not failures, failures
    assert ids(got) == ids(make(1, start=6)) and leased.outages == 1
    leased.close()


def test_an_idle_healthy_redis_is_not_an_outage(primary: LocalRedisServer) -> None:
    """Waits longer than the socket timeout (1 s) on a healthy, empty Redis: `read(timeout=2.5)`
    returns nothing, `batches(poll=2, idle_timeout=3)` ends as idle with no outage, and
    `read(timeout=None)` keeps waiting (here for 4 XREADGROUPs, past the socket timeout) until a
    sample arrives."""
    reader = RedisStreamReader(primary.url, stream=STREAM, consumer="c", claim_idle=None,
                               socket_timeout=1)  # fmt: skip
    assert reader.read(10, timeout=2.5) == []
    assert list(reader.batches(10, idle_timeout=3, poll=2, unreachable_timeout=0)) == []
    assert reader.outages == 0 and reader.unreachable_retries == 0

    stats = redis.Redis.from_url(primary.url)

    def calls() -> int:
        return int(stats.info("commandstats").get("cmdstat_xreadgroup", {}).get("calls", 0))

    before = calls()

    def late_sample() -> None:
        wait_for(lambda: calls() >= before + 6, "XREADGROUPs past the socket timeout")
        with RedisStreamSink(primary.url, stream=STREAM) as sink:
            sink.write(make(1))

    thread, failures = in_background(late_sample)
    got = reader.read(10, timeout=None)
    thread.join()
    assert not failures, failures
    assert ids(got) == ids(make(1))
    reader.close()
