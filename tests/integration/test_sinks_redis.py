"""Redis Streams sink and reader against a real redis-server (started here on a free port)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_reading import drain, wait_for
from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.buffered import Backoff, BufferedSink
from tito_agents.sinks.harness import LocalRedisServer, free_port, synthetic_sample
from tito_agents.sinks.registry import open_sink

pytest.importorskip("redis", reason="redis-py not installed (pip install redis)")
if shutil.which("redis-server") is None:
    pytest.skip(
        "redis-server not installed (apt-get install redis-server)", allow_module_level=True
    )

from tito_agents.sinks.redis_streams import (
    RedisStreamReader,
    RedisStreamSink,
)

FAST = Backoff(initial=0.02, maximum=0.2)


@pytest.fixture(scope="module")
def server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as srv:
        yield srv


@pytest.fixture
def stream(request: pytest.FixtureRequest) -> str:
    return f"test:{request.node.name}"


def make(n: int, start: int = 0, tokens: int = 64) -> list[Sample]:
    return [synthetic_sample(i, tokens) for i in range(start, start + n)]


def ids(samples: list[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


@pytest.mark.parametrize("transaction", [False, True])
def test_roundtrip_through_a_consumer_group(
    server: LocalRedisServer, stream: str, transaction: bool
) -> None:
    """Samples written with XADD (pipelined or MULTI/EXEC) come back exactly through a consumer
    group; acknowledged entries are deleted, so the stream only holds unread samples."""
    samples = make(30, tokens=2000)
    samples[3].logprobs = None  # not captured for that call
    sink = RedisStreamSink(server.url, stream=stream, batch_size=8, transaction=transaction)
    sink.write(samples)
    assert sink.client.xlen(stream) == 30
    sink.close()
    with RedisStreamReader(server.url, stream=stream) as reader:
        got = drain(reader, 30)
        assert ids(got) == ids(samples)
        for a, b in zip(samples, got, strict=True):
            assert (a.token_ids == b.token_ids).all() and (a.loss_mask == b.loss_mask).all()
            assert (a.logprobs is None and b.logprobs is None) or (
                a.logprobs is not None
                and b.logprobs is not None
                and (a.logprobs == b.logprobs).all()
            )
            assert a.spans[0].to_dict() == b.spans[0].to_dict() and a.metadata == b.metadata
        assert reader.client.xlen(stream) == 0 and reader.unacknowledged == 0


def test_unacknowledged_samples_come_back_after_a_reader_crash(
    server: LocalRedisServer, stream: str
) -> None:
    """A trainer that crashes before ack gets the same samples again on restart (at least once),
    and nothing twice once they are acknowledged."""
    with RedisStreamSink(server.url, stream=stream) as sink:
        sink.write(make(10))
    first = RedisStreamReader(server.url, stream=stream, consumer="trainer-0")
    assert len(first.read(10, timeout=1)) == 10
    first.close()  # crashed: no ack
    second = RedisStreamReader(server.url, stream=stream, consumer="trainer-0")
    again = drain(second, 10)
    assert ids(again) == ids(make(10))
    second.close()
    third = RedisStreamReader(server.url, stream=stream, consumer="trainer-0")
    assert third.read(10, timeout=0.2) == []
    third.close()


def test_a_dead_consumers_samples_are_claimed(server: LocalRedisServer, stream: str) -> None:
    """Entries a vanished consumer never acknowledged are claimed by another after claim_idle."""
    with RedisStreamSink(server.url, stream=stream) as sink:
        sink.write(make(6))
    gone = RedisStreamReader(server.url, stream=stream, consumer="gone")
    assert len(gone.read(6, timeout=1)) == 6
    gone.close()
    time.sleep(0.3)
    with RedisStreamReader(server.url, stream=stream, consumer="alive", claim_idle=0.2) as alive:
        assert ids(drain(alive, 6)) == ids(make(6))


def test_duplicates_from_producer_retries_are_removed(
    server: LocalRedisServer, stream: str
) -> None:
    """A sample stored twice (a retried batch) reaches the trainer once, also after the reader
    restarts."""
    samples = make(8)
    with RedisStreamSink(server.url, stream=stream) as sink:
        sink.write(samples)
        sink.write(samples[:3])  # the retry of a batch whose reply was lost
    with RedisStreamReader(server.url, stream=stream) as reader:
        got = drain(reader, 8)
        assert reader.read(10, timeout=0.3) == []
        assert ids(got) == ids(samples) and reader.duplicates_dropped == 3
    with RedisStreamSink(server.url, stream=stream) as sink:
        sink.write(samples[5:])  # duplicates arriving after a reader restart
    with RedisStreamReader(server.url, stream=stream) as restarted:
        assert restarted.read(10, timeout=0.3) == []
        assert restarted.duplicates_dropped == 3


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_redis_down_and_restarted_loses_nothing(
    server: LocalRedisServer, stream: str, tmp_path: Path, how: str
) -> None:
    """Redis crashing (kill -9) or stopping mid-run: the buffered sink retries, spills at its
    bound and, after the restart, the reader sees every sample exactly once."""
    sink = open_sink(
        f"{server.url}?stream={stream}",
        spill_dir=tmp_path / "spill",
        max_buffer_samples=20,
        linger=0.001,
    )
    assert isinstance(sink, BufferedSink)
    sink.retry = FAST
    samples = make(300, tokens=500)
    reader = RedisStreamReader(server.url, stream=stream, socket_timeout=2, connect_timeout=1)
    seen: list[str] = []
    for i in range(0, 100, 5):
        sink.write(samples[i : i + 5])
    seen += ids(drain(reader, 50, timeout=5))
    server.kill() if how == "kill" else server.stop()
    for i in range(100, 250, 5):
        sink.write(samples[i : i + 5])
        time.sleep(0.005)
    wait_for(lambda: sink.stats.failed_attempts > 0 and sink.stats.spilled > 0, "a spill")
    server.start()
    for i in range(250, 300, 5):
        sink.write(samples[i : i + 5])
    sink.flush(timeout=30)
    sink.close()
    seen += ids(drain(reader, 300 - len(seen), timeout=30))
    reader.close()
    assert sorted(seen) == sorted(ids(samples))
    assert len(seen) == len(set(seen)) == 300
    assert sink.stats.exported == 300 and sink.stats.replayed == sink.stats.spilled


def test_a_full_stream_applies_backpressure(server: LocalRedisServer, stream: str) -> None:
    """Past max_backlog unread entries, write waits for readers, then raises a retryable error;
    it proceeds once readers catch up."""
    sink = RedisStreamSink(server.url, stream=stream, max_backlog=20, backlog_timeout=0.3)
    sink.write(make(20))
    with pytest.raises(SinkError, match="readers are behind") as caught:
        sink.write(make(1, start=20))
    assert caught.value.retryable
    reader = RedisStreamReader(server.url, stream=stream)
    drain(reader, 20)
    sink.write(make(1, start=20))
    assert ids(drain(reader, 1)) == ["ep5/20"]
    reader.close()
    sink.close()
    assert sink.backpressure_waits == 2


def test_maxlen_trims_the_stream(server: LocalRedisServer, stream: str) -> None:
    """maxlen caps the stream length (oldest entries go, read or not: documented)."""
    sink = RedisStreamSink(server.url, stream=stream, maxlen=10, approximate=False)
    sink.write(make(25))
    assert sink.client.xlen(stream) == 10
    sink.close()


def test_password_auth(tmp_path: Path) -> None:
    """A password in the URL authenticates; a wrong one is a non-retryable error."""
    with LocalRedisServer(extra_args=["--requirepass", "s3cret"]) as srv:
        good = open_sink(f"redis://:s3cret@127.0.0.1:{srv.port}/0?stream=auth", buffered=False)
        good.write(make(2))
        good.close()
        bad = RedisStreamSink(f"redis://:wrong@127.0.0.1:{srv.port}/0", stream="auth")
        with pytest.raises(SinkError) as caught:
            bad.write(make(1))
        assert not caught.value.retryable
        bad.close()
        with RedisStreamReader(srv.url, stream="auth", password="s3cret") as reader:
            assert len(drain(reader, 2)) == 2


def _self_signed_cert(folder: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl CLI not installed: cannot make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls(tmp_path: Path) -> None:
    """rediss:// with a CA certificate carries samples over TLS."""
    cert, key = _self_signed_cert(tmp_path)
    port = free_port()
    tls_args = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert)]
    tls_args += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
    tls_args += ["--tls-auth-clients", "no"]
    with LocalRedisServer(port=port, extra_args=tls_args):
        url = f"rediss://127.0.0.1:{port}/0"
        sink = open_sink(f"{url}?stream=tls", buffered=False, ssl_ca_certs=str(cert))
        sink.write(make(3))
        sink.close()
        with RedisStreamReader(url, stream="tls", ssl_ca_certs=str(cert)) as reader:
            assert ids(drain(reader, 3)) == ids(make(3))
        plain = RedisStreamSink(f"redis://127.0.0.1:{port}/0", stream="tls", socket_timeout=1)
        with pytest.raises(SinkError):
            plain.write(make(1))
        plain.close()


def test_collector_episodes_reach_a_trainer_through_redis(
    server: LocalRedisServer, stream: str, tmp_path: Path
) -> None:
    """A Collector writing to open_sink("redis://…") hands every episode's samples, token for
    token, to a consumer-group reader."""
    import openai

    import tito_agents as tito
    from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

    with FakeVLLMServer(FakeConfig()) as fake:
        sink = open_sink(f"{server.url}?stream={stream}", spill_dir=tmp_path / "spill")
        collector = tito.Collector(sink, capture_logprobs=True)
        client = collector.wrap(openai.OpenAI(base_url=fake.base_url, api_key="EMPTY"))
        for i in range(3):
            with collector.episode(task_id=f"t{i}", group_id="g") as episode:
                for turn in range(2):
                    client.chat.completions.create(
                        model="SmolLM2-135M-Instruct",
                        messages=[{"role": "user", "content": f"question {i}.{turn}"}],
                        max_tokens=8,
                    )
                episode.set_reward(float(i))
        collector.close()
        client.close()
    with RedisStreamReader(server.url, stream=stream) as reader:
        got = drain(reader, 6)
    assert len(got) == collector.stats.samples == 6
    assert sum(s.num_tokens for s in got) == collector.stats.tokens
    assert sorted((s.task_id, s.reward) for s in got) == sorted(
        (f"t{i}", float(i)) for i in range(3) for _ in range(2)
    )
    assert all(s.logprobs is not None and s.num_trained > 0 for s in got)
