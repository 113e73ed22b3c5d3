"""Producers (`open_sink("redis://...")`, a `BufferedSink` with a spill folder) under real faults:
several producer processes write while redis-server is killed with SIGKILL and restarted, and one
producer is SIGKILLed during the outage. Against a real redis-server (AOF, fsync always) on
loopback; each producer is a child process that records every sample id its `write` returned
for (acknowledged)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tito_agents.errors import SinkError
from tito_agents.sinks.buffered import Backoff, BufferedSink
from tito_agents.sinks.harness import LocalRedisServer
from tito_agents.sinks.registry import open_sink

pytest.importorskip("redis", reason="redis-py not installed (pip install redis)")
if shutil.which("redis-server") is None:
    pytest.skip(
        "redis-server not installed (apt-get install redis-server)", allow_module_level=True
    )

from tito_agents.sinks.redis_streams import RedisStreamReader

SPILL_AFTER = 0.3
"""The window after which samples wait on disk, not in memory, in an outage (the victim waits
until all it acknowledged is on disk before it is killed, so that no timing decides the test)."""

PRODUCER = textwrap.dedent(
    """
    import sys, time
    from tito_agents.sinks.buffered import Backoff
    from tito_agents.sinks.registry import open_sink
    from tito_agents.sinks.harness import synthetic_sample

    url, stream, spill, name, count, acks, window = sys.argv[1:8]
    sink = open_sink(f"{url}?stream={stream}&spill_after={window}", spill_dir=spill)
    sink.retry = Backoff(initial=0.02, maximum=0.2)
    with open(acks, "a", buffering=1) as out:
        for i in range(int(count)):
            sample = synthetic_sample(i, 256, episode_id=name)
            sink.write([sample])
            out.write(sample.sample_id + "\\n")  # acknowledged: write returned
            time.sleep(0.01)
        out.write("done\\n")
        if name == "victim":  # Redis is down: nothing left in memory = all of it on disk
            while sink.stats.buffered:
                time.sleep(0.01)
            out.write("on disk\\n")
            time.sleep(600)  # idles until the test kills it
        sink.close()
        out.write("closed\\n")
    """
)


@pytest.fixture
def server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer(appendfsync="always") as srv:
        yield srv


def acked(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [line for line in lines if "/" in line]


def wait_for(condition: object, timeout: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_redis_killed_and_a_producer_killed_mid_outage_lose_no_acknowledged_sample(
    server: LocalRedisServer, tmp_path: Path
) -> None:
    """3 producers write; redis-server is SIGKILLed and restarted a few seconds later; one
    producer, done writing, is SIGKILLed mid-outage more than spill_after after its last write.
    A producer restarted on its spill folder delivers what it left; the reader then sees every
    acknowledged sample of every producer exactly once (duplicates of retried batches removed),
    and nothing that was never written."""
    stream = "test:producer-faults"
    names = {"a": 500, "b": 500, "victim": 150}
    acks = {name: tmp_path / f"{name}.acks" for name in names}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-c",
                PRODUCER,
                server.url,
                stream,
                str(tmp_path / f"spill-{name}"),
                name,
                str(count),
                str(acks[name]),
                str(SPILL_AFTER),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, count in names.items()
    }
    try:
        wait_for(lambda: all(len(acked(p)) >= 40 for p in acks.values()), 30, "the first writes")
        server.kill()  # kill -9 while every producer is writing
        killed_at = time.monotonic()
        wait_for(lambda: "done" in acks["victim"].read_text(), 20, "the victim's last write")
        assert len(acked(acks["victim"])) == names["victim"]
        wait_for(lambda: "on disk" in acks["victim"].read_text(), 60, "the victim's spill")
        os.kill(procs["victim"].pid, signal.SIGKILL)
        procs["victim"].communicate(timeout=10)
        assert procs["victim"].returncode == -signal.SIGKILL
        time.sleep(max(0.0, 3.0 - (time.monotonic() - killed_at)))  # an outage of a few seconds
        server.start()
        for name in ("a", "b"):
            _, err = procs[name].communicate(timeout=40)
            assert procs[name].returncode == 0, err
            assert acked(acks[name]) == [f"{name}/{i}" for i in range(names[name])]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()  # reaps it and closes its pipe

    # The victim's replacement: a new producer on its spill folder delivers what it left.
    restarted = open_sink(f"{server.url}?stream={stream}", spill_dir=tmp_path / "spill-victim")
    assert isinstance(restarted, BufferedSink)
    restarted.retry = Backoff(initial=0.02, maximum=0.2)
    restarted.flush(timeout=20)  # (its replay starts when it opens: no count to read before)
    restarted.close()
    assert restarted.stats.replayed > 0 and restarted.stats.spill_pending == 0

    seen: list[str] = []
    with RedisStreamReader(server.url, stream=stream) as reader:
        deadline = time.monotonic() + 20
        idle_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - idle_since < 1.0:
            try:
                batch = reader.read(500, timeout=0.2)
            except SinkError as exc:
                assert exc.retryable
                continue
            if batch:
                idle_since = time.monotonic()
            seen += [s.sample_id for s in batch]
            reader.ack(batch)
    assert len(seen) == len(set(seen)), "the reader saw a sample twice"
    written = {f"{name}/{i}" for name, count in names.items() for i in range(count)}
    assert set(seen) <= written
    for name in names:
        missing = [sid for sid in acked(acks[name]) if sid not in set(seen)]
        assert not missing, f"{name}: {len(missing)} acknowledged samples lost: {missing[:5]}"
    assert len(acked(acks["victim"])) == names["victim"]
