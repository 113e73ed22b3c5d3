"""RedisStreamReader under real faults: a trainer SIGKILLed and restarted, Redis killed with a read
reply in flight, a reader asked to stop while entries are pending, and the memory the dedupe state
takes in Redis. Against a real redis-server (AOF, fsync always) on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.harness import LocalRedisServer, synthetic_sample

pytest.importorskip("redis", reason="redis-py not installed (pip install redis)")
if shutil.which("redis-server") is None:
    pytest.skip(
        "redis-server not installed (apt-get install redis-server)", allow_module_level=True
    )

from tests.support.redis_reading import drain
from tito_agents.sinks.redis_streams import RedisStreamReader, RedisStreamSink

CLAIM_IDLE = 600.0
"""Far above every bound below: what these tests check must not come from the idle claim."""


@pytest.fixture(scope="module")
def server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as srv:
        yield srv


@pytest.fixture
def stream(request: pytest.FixtureRequest) -> str:
    return f"faults:{request.node.name}"


@pytest.fixture(autouse=True)
def no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default consumer name depends on RANK / LOCAL_RANK: start from a plain process."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def make(n: int, start: int = 0, tokens: int = 32) -> list[Sample]:
    return [synthetic_sample(i, tokens) for i in range(start, start + n)]


def ids(samples: list[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


def write(url: str, stream: str, samples: list[Sample]) -> None:
    with RedisStreamSink(url, stream=stream) as sink:
        sink.write(samples)


_CHILD = """
import json, sys, time
from tito_agents.sinks.redis_streams import RedisStreamReader
url, stream, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = RedisStreamReader(url, stream=stream, claim_idle=600)
got = []
deadline = time.monotonic() + 20
while len(got) < n and time.monotonic() < deadline:
    got += reader.read(n, timeout=0.2)
print(json.dumps({"consumer": reader.consumer, "ids": [s.sample_id for s in got]}), flush=True)
time.sleep(120)  # "training": killed before it acknowledges anything
"""


def test_a_killed_trainer_restarted_with_the_default_name_gets_its_samples_at_once(
    server: LocalRedisServer, stream: str
) -> None:
    """A trainer SIGKILLed after read, before ack, restarts under the same default consumer name
    and is handed its pending samples at once (claim_idle is 600 s), each exactly once."""
    samples = make(8)
    write(server.url, stream, samples)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, server.url, stream, "8"],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        assert ready, "the child reader did not report"
        report = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    assert report["ids"] == ids(samples)
    started = time.monotonic()
    with RedisStreamReader(server.url, stream=stream, claim_idle=CLAIM_IDLE) as restarted:
        got = drain(restarted, 8, timeout=10)
        assert restarted.consumer == report["consumer"]
        assert ids(got) == ids(samples)
        assert time.monotonic() - started < 10  # far under claim_idle
        assert restarted.read(10, timeout=0.3) == []
    with RedisStreamReader(server.url, stream=stream, claim_idle=CLAIM_IDLE) as again:
        assert again.read(10, timeout=0.3) == []  # acknowledged: not handed out twice


def test_live_readers_never_share_a_default_name(
    server: LocalRedisServer, stream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two live readers of a group on one host (even in one process) get distinct default names
    and split the samples without overlap; a second live reader claiming the same RANK is refused
    rather than silently sharing the first one's pending entries; a closed reader's name is
    free again."""
    write(server.url, stream, make(10))
    first = RedisStreamReader(server.url, stream=stream, claim_idle=CLAIM_IDLE)
    second = RedisStreamReader(server.url, stream=stream, claim_idle=CLAIM_IDLE)
    got_first = first.read(5, timeout=1)
    got_second = drain(second, 5, timeout=5)
    assert first.consumer != second.consumer
    assert len(got_first) == len(got_second) == 5
    assert not set(ids(got_first)) & set(ids(got_second))
    # first restarts without acknowledging: its pending samples come back to it, not to second
    name = first.consumer
    first.close()
    with RedisStreamReader(server.url, stream=stream, claim_idle=CLAIM_IDLE) as restarted:
        assert restarted.consumer == name
        assert ids(drain(restarted, 5, timeout=5)) == ids(got_first)
    second.close()

    monkeypatch.setenv("RANK", "3")
    rank = RedisStreamReader(server.url, stream=stream)
    assert rank.consumer == "trainer-rank3"
    twin = RedisStreamReader(server.url, stream=stream)  # e.g. a DataLoader worker inheriting RANK
    with pytest.raises(ConfigurationError, match="held by a live reader"):
        twin.read(1, timeout=0.1)
    twin.close()
    rank.close()
    with RedisStreamReader(server.url, stream=stream) as after:
        assert after.consumer == "trainer-rank3"


class _Proxy:
    """A TCP relay on loopback between the reader and Redis that can drop Redis's replies: Redis
    then applies a read (the entries become pending for the reader) whose reply never arrives, as
    when Redis crashes or the network fails between the two."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drop_replies = False
        self.cut_next_reply = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                client.close()  # Redis is down: the reader sees a refused connection
                continue
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 0.5)
                if self._closed:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        upstream.sendall(data)
                    elif self.cut_next_reply:
                        self.cut_next_reply = False
                        return  # reply dropped, connection closed
                    elif not self.drop_replies:
                        client.sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def disconnect_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        self.disconnect_all()


@pytest.fixture
def proxy(server: LocalRedisServer) -> Iterator[_Proxy]:
    relay = _Proxy(server.port)
    yield relay
    relay.close()


def _pending_for(url: str, stream: str, consumer: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        summary: Any = client.xpending(stream, "trainer")
    finally:
        client.close()
    return sum(int(c["pending"]) for c in summary["consumers"] if c["name"].decode() == consumer)


def test_redis_killed_with_a_read_reply_in_flight(
    server: LocalRedisServer, stream: str, proxy: _Proxy
) -> None:
    """Redis delivers entries to the reader (they are pending for it, and kept by the AOF), the
    reply is lost, Redis is killed -9 and restarted: the reader re-reads its pending entries as
    soon as it reconnects instead of leaving them to the idle claim (600 s here)."""
    reader = RedisStreamReader(
        proxy.url, stream=stream, claim_idle=CLAIM_IDLE, socket_timeout=1, connect_timeout=1
    )
    write(server.url, stream, make(4))
    assert ids(drain(reader, 4, timeout=5)) == ids(make(4))
    proxy.drop_replies = True
    write(server.url, stream, make(6, start=4))
    with pytest.raises(SinkError) as caught:
        reader.read(10, timeout=0.2)
    assert caught.value.retryable
    assert _pending_for(server.url, stream, reader.consumer) == 6  # delivered, never received
    server.kill()
    proxy.disconnect_all()
    proxy.drop_replies = False
    server.start()
    started = time.monotonic()
    got = drain(reader, 6, timeout=10)
    assert ids(got) == ids(make(6, start=4))
    assert time.monotonic() - started < 10 and reader.rereads >= 1
    assert reader.read(10, timeout=0.3) == []
    reader.close()


def test_a_reply_lost_and_retried_by_redis_py_is_noticed(
    server: LocalRedisServer, stream: str, proxy: _Proxy
) -> None:
    """redis-py retries a read once over a new connection, so a reply lost with its connection
    raises nothing: the reader still notices (Redis counts more entries pending for it than it
    holds) and re-reads them."""
    reader = RedisStreamReader(proxy.url, stream=stream, claim_idle=CLAIM_IDLE, socket_timeout=2)
    write(server.url, stream, make(2))
    assert len(drain(reader, 2, timeout=5)) == 2
    write(server.url, stream, make(5, start=2))
    proxy.cut_next_reply = True
    first = reader.read(10, timeout=0.2)  # delivered, reply dropped, retried: nothing new
    assert first == [] and not proxy.cut_next_reply
    got = first + drain(reader, 5, timeout=5)
    assert ids(got) == ids(make(5, start=2)) and reader.rereads == 1
    reader.close()


def test_batches_waits_for_what_is_pending_before_it_returns(
    server: LocalRedisServer, stream: str
) -> None:
    """A trainer that stops when idle (batches(idle_timeout=…)) first waits for entries another
    (dead) consumer left pending, claims them once idle for claim_idle, and trains on them."""
    write(server.url, stream, make(6))
    crashed = RedisStreamReader(server.url, stream=stream, consumer="crashed")
    assert len(crashed.read(6, timeout=1)) == 6
    crashed.client.close()  # dies without ack and without close()
    with RedisStreamReader(server.url, stream=stream, consumer="last", claim_idle=1.5) as reader:
        got = [s for batch in reader.batches(10, idle_timeout=0.2, poll=0.1) for s in batch]
        assert ids(got) == ids(make(6))
        assert reader.pending_elsewhere() == 0
    with RedisStreamReader(server.url, stream=stream, consumer="late") as late:
        assert late.read(10, timeout=0.3) == []


def test_batches_without_wait_pending_returns_when_idle(
    server: LocalRedisServer, stream: str
) -> None:
    """wait_pending=False stops on idleness alone: idle for idle_timeout, whatever is pending."""
    write(server.url, stream, make(3))
    crashed = RedisStreamReader(server.url, stream=stream, consumer="crashed")
    assert len(crashed.read(3, timeout=1)) == 3
    crashed.client.close()
    with RedisStreamReader(server.url, stream=stream, consumer="x", claim_idle=CLAIM_IDLE) as r:
        started = time.monotonic()
        assert list(r.batches(10, idle_timeout=0.2, poll=0.1, wait_pending=False)) == []
        assert time.monotonic() - started < 5
        assert r.pending_elsewhere() == 3


def test_close_hands_unacknowledged_samples_back(server: LocalRedisServer, stream: str) -> None:
    """close() does not wait: what the reader holds unacknowledged is marked idle, so another
    reader claims it at once rather than after claim_idle."""
    write(server.url, stream, make(5))
    leaving = RedisStreamReader(server.url, stream=stream, consumer="leaving")
    assert len(leaving.read(5, timeout=1)) == 5
    leaving.close()
    with RedisStreamReader(
        server.url, stream=stream, consumer="other", claim_idle=CLAIM_IDLE
    ) as other:
        assert ids(drain(other, 5, timeout=5)) == ids(make(5))


def test_dedupe_after_restart_in_bounded_memory(stream: str) -> None:
    """Copies of acknowledged samples are dropped by a restarted reader, and the dedupe state
    costs about 9 bytes per acknowledged id (a key per id would cost ≈ 88 by MEMORY USAGE,
    ≈ 133 by INFO used_memory), within the documented bound n × 9 B + shards × 120 B."""
    n, shards = 8_000, 32  # 250 ids per shard: packed sets (≤ 512)
    samples = make(n, tokens=2)
    with LocalRedisServer(appendfsync="everysec") as srv:  # no fsync per ack: not tested here
        write(srv.url, stream, samples)
        with RedisStreamReader(srv.url, stream=stream, dedupe_shards=shards) as reader:
            assert len(drain(reader, n, timeout=120)) == n
        write(srv.url, stream, samples[100:110])  # a producer retry, after the reader stopped
        with RedisStreamReader(srv.url, stream=stream, dedupe_shards=shards) as restarted:
            assert restarted.read(50, timeout=0.3) == []
            assert restarted.duplicates_dropped == 10
        import redis

        client = redis.Redis.from_url(srv.url)
        keys = list(client.scan_iter(match=f"{stream}:seen:*", count=1000))
        used = sum(int(client.memory_usage(key) or 0) for key in keys)
        assert all(client.object("encoding", key) == b"intset" for key in keys)
        assert all(0 < int(client.ttl(key)) <= 2 * 3600 for key in keys)
        client.close()
    assert len(keys) <= shards
    assert used <= n * 9 + shards * 120, f"{used / n:.1f} bytes per id"
