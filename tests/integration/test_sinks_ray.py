"""Ray sink and reader on a real local Ray cluster (one CPU, no dashboard)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tito_agents.samples import Sample
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.registry import open_sink

ray = pytest.importorskip("ray", reason="Ray not installed (pip install ray)")

from tito_agents.sinks.ray_queue import RayReader, RaySink, queue_actor  # noqa: E402 - needs ray

NAMESPACE = "tito-tests"


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster for this module; yields its address for other driver processes."""
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=512 * 1024 * 1024,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture
def queue_name(request: pytest.FixtureRequest, cluster: str) -> Iterator[str]:
    name = f"q-{request.node.name}"[:60]
    yield name
    with contextlib.suppress(ValueError):  # already gone
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))


def make(n: int, start: int = 0, tokens: int = 256) -> list[Sample]:
    return [synthetic_sample(i, tokens) for i in range(start, start + n)]


def ids(samples: list[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


def read_all(reader: RayReader, expected: int, timeout: float = 60) -> list[Sample]:
    got: list[Sample] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        got += reader.read(64, timeout=0.5)
    return got


def test_batches_travel_by_reference_and_arrive_in_order(queue_name: str) -> None:
    """Samples go in batches (one ray.put per batch, one actor call per write) and come back
    exact."""
    samples = make(200, tokens=4096)
    sink = RaySink(queue_name, namespace=NAMESPACE, batch_size=50, capacity=1000)
    sink.write(samples)
    sink.flush()
    assert (sink.batches_sent, sink.actor_calls) == (4, 1)
    reader = RayReader(queue_name, namespace=NAMESPACE)
    got = read_all(reader, 200)
    sink.close()
    assert ids(got) == ids(samples)
    assert all((a.token_ids == b.token_ids).all() for a, b in zip(samples, got, strict=True))
    assert got[0].token_ids.flags.writeable
    assert reader.stats()["acked"] == 200


def test_actor_gone_mid_run_delivers_everything_exactly_once(queue_name: str) -> None:
    """Killing the queue actor mid-run: the producer re-creates it and re-sends what no reader
    had acknowledged; the reader drops the copies, so it sees every sample once."""
    sink = RaySink(queue_name, namespace=NAMESPACE, batch_size=10, capacity=500)
    reader = RayReader(queue_name, namespace=NAMESPACE)
    samples = make(150)
    sink.write(samples[:100])
    sink.flush()
    seen = ids(read_all(reader, 30))
    ray.kill(ray.get_actor(queue_name, namespace=NAMESPACE))
    sink.write(samples[100:])
    sink.flush()
    seen += ids(read_all(reader, 150 - len(seen)))
    sink.close()
    assert sorted(seen) == sorted(ids(samples)) and len(seen) == 150
    assert sink.actor_restarts + sink.resent_batches > 0
    assert reader.read(64, timeout=0.5) == []


def test_a_slow_reader_bounds_what_the_actor_holds(queue_name: str) -> None:
    """With capacity 40 the producer waits for the reader: the actor never holds more."""
    sink = RaySink(queue_name, namespace=NAMESPACE, batch_size=10, capacity=40)
    reader = RayReader(queue_name, namespace=NAMESPACE, capacity=40)
    samples = make(120)

    def produce() -> None:
        sink.write(samples)
        sink.flush()

    writer = threading.Thread(target=produce)
    writer.start()
    got: list[Sample] = []
    high_water = 0
    deadline = time.monotonic() + 60
    while len(got) < 120 and time.monotonic() < deadline:
        stats = reader.stats()
        high_water = max(high_water, stats["queued_samples"] + stats["leased_samples"])
        got += reader.read(10, timeout=0.5)
        time.sleep(0.02)
    writer.join()
    sink.close()
    assert ids(got) == ids(samples)
    assert high_water <= 40 and sink.backpressure_waits > 0


_PRODUCER = textwrap.dedent(
    """
    import os, sys
    import ray
    from tito_agents.sinks.ray_queue import RaySink
    from tito_agents.sinks.harness import synthetic_sample
    address, name, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    ray.init(address=address, log_to_driver=False)
    sink = RaySink(name, namespace="tito-tests", batch_size=8,
                   adopt="eager" if mode == "crash-eager" else "close")
    sink.write([synthetic_sample(i, 4096) for i in range(40)])  # 300 KB batches: in plasma
    sink.flush()
    if mode.startswith("crash"):
        os._exit(9)
    if mode == "exit":
        sys.exit(0)  # forgot close(): the at-exit hook hands the batches over
    sink.close()
    ray.shutdown()
    """
)


def _run_producer(address: str, name: str, mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _PRODUCER, address, name, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stderr


@pytest.mark.parametrize("mode", ["close", "exit"])
def test_samples_outlive_a_producer_that_exited(cluster: str, queue_name: str, mode: str) -> None:
    """close() (or, if forgotten, the at-exit hook, with a warning) hands unread batches to the
    actor: a reader gets them after the producer exits."""
    stderr = _run_producer(cluster, queue_name, mode)
    assert ("UnclosedSinkWarning" in stderr) == (mode == "exit")
    reader = RayReader(queue_name, namespace=NAMESPACE)
    assert ids(read_all(reader, 40)) == ids(make(40, tokens=4096))
    assert reader.lost_batches == 0


def test_a_crashed_producer_loses_nothing_silently(cluster: str, queue_name: str) -> None:
    """A producer killed before close: every batch reaches the reader or is counted as lost
    (Ray may drop objects whose owner died); with adopt="eager" every batch arrives."""
    _run_producer(cluster, queue_name, "crash")
    reader = RayReader(queue_name, namespace=NAMESPACE)
    got = read_all(reader, 40, timeout=10)
    assert len(got) + 8 * reader.lost_batches == 40
    eager = f"{queue_name}-eager"
    _run_producer(cluster, eager, "crash-eager")
    eager_reader = RayReader(eager, namespace=NAMESPACE)
    assert ids(read_all(eager_reader, 40)) == ids(make(40, tokens=4096))
    ray.kill(ray.get_actor(eager, namespace=NAMESPACE))


class _Owner:
    """Puts a batch into the object store as its owner (and can then be killed)."""

    def put(self, payload: list[dict[str, object]]) -> list[object]:
        return [ray.put(payload)]


_ShortLivedOwner: Any = ray.remote(_Owner)


def test_lost_batches_are_counted_and_logged(
    queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch whose owner died before handing it over is reported (counter and error log),
    and the batches after it flow on."""
    samples = make(20, tokens=4096)
    owner = _ShortLivedOwner.remote()
    lost_refs = ray.get(owner.put.remote([s.to_dict() for s in samples[:10]]))
    actor = queue_actor(queue_name, namespace=NAMESPACE)
    ray.get(actor.put.remote("dead-producer", [(0, lost_refs, 10)]))
    ray.kill(owner)
    time.sleep(1.0)
    sink = RaySink(queue_name, namespace=NAMESPACE, batch_size=10)
    sink.write(samples[10:])
    sink.close()
    reader = RayReader(queue_name, namespace=NAMESPACE)
    got = read_all(reader, 10, timeout=10)
    assert ids(got) == ids(samples[10:])
    assert reader.lost_batches == 1 and "is lost" in caplog.text


def test_a_dead_readers_lease_expires(queue_name: str) -> None:
    """A batch leased to a reader that never acknowledges is served again after lease_timeout."""
    sink = RaySink(queue_name, namespace=NAMESPACE, batch_size=5, lease_timeout=0.5)
    sink.write(make(5))
    sink.close()
    actor = ray.get_actor(queue_name, namespace=NAMESPACE)
    assert len(ray.get(actor.get.remote(5, 1.0))) == 1  # leased, never acknowledged
    reader = RayReader(queue_name, namespace=NAMESPACE)
    assert reader.read(5, timeout=0.2) == []
    time.sleep(0.6)
    assert ids(read_all(reader, 5)) == ids(make(5))


def test_open_sink_ray_spec(queue_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """open_sink("ray://name") gives a buffered Ray sink whose samples a RayReader receives."""
    spill = tmp_path_factory.mktemp("spill")
    sink = open_sink(f"ray://{queue_name}?namespace={NAMESPACE}&batch_size=16", spill_dir=spill)
    assert isinstance(sink, BufferedSink) and isinstance(sink.inner, RaySink)
    sink.write(make(40))
    sink.close()
    reader = RayReader(queue_name, namespace=NAMESPACE)
    assert ids(read_all(reader, 40)) == ids(make(40))
