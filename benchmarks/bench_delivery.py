"""Delivery from a CPU-saturated producer through `BufferedSink` to Redis consumers.

One producer process, pinned to one core, runs `--episodes` (64) concurrent asyncio episodes as
fast as the core allows: each episode makes `--calls` (3) "calls" (`--burn-ms` of pure-Python work
holding the GIL, then an await), then writes its samples with one `write`, as the collector does
at an episode's exit. Redis is healthy (a `redis-server` this script starts) and `--consumers` (2)
trainer processes read the stream through one consumer group, all on the other cores. Reported:

* accept -> consumer latency p50 / p99: each sample carries the wall-clock time `write` was
  called; a consumer subtracts it from the time it read the sample (target: p99 < 1 s);
* accept -> stored p50 / p99: the same up to the moment `inner.write` returned, i.e. the delivery
  thread's own lag (what the consumer adds on top is the consumers' speed, not the producer's);
* samples spilled (target: none; spilling with a healthy destination means the delivery thread fell
  a whole buffer behind: the loss window a producer killed then would have had), `inner.write`
  calls and paced writes;
* samples/s with `open_sink("redis://...")` vs the same loop writing to a sink that keeps nothing,
  by wall clock and per CPU-second of the producer process (the second is steadier on a shared
  machine: it is what delivery costs, whatever else runs on the core);
* the machine's load average (`os.getloadavg()`) beside each figure.

Usage: python benchmarks/bench_delivery.py [--check] [--seconds S] [--tokens N] [--burn-ms MS]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tito_agents.samples import Sample
from tito_agents.sinks.base import Sink
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.harness import LocalRedisServer, synthetic_sample
from tito_agents.sinks.registry import open_sink

P99_TARGET = 1.0

CONSUMER = textwrap.dedent(
    """
    import json, os, sys, time
    from tito_agents.sinks.redis_streams import RedisStreamReader

    url, stream, name, done, out = sys.argv[1:6]
    reader = RedisStreamReader(url, stream=stream, consumer=name)
    latencies = []
    idle_since = time.monotonic()
    print("ready", flush=True)
    while True:
        batch = reader.read(512, timeout=0.1)
        now = time.time()
        latencies += [now - s.metadata["accepted_at"] for s in batch]
        reader.ack(batch)
        if batch:
            idle_since = time.monotonic()
        elif os.path.exists(done) and time.monotonic() - idle_since > 1.0:
            break
    reader.close()
    with open(out, "w") as handle:
        json.dump(latencies, handle)
    """
)


class NullSink(Sink):
    """Keeps nothing: the producer loop's own speed, the baseline for the ratio."""

    def write(self, samples: Sequence[Sample]) -> None:
        pass


def burn(ms: float) -> None:
    """Pure-Python work holding the GIL (response parsing, tokenizer glue, agent logic)."""
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        for i in range(200):
            x += i * i


@dataclasses.dataclass
class Run:
    written: int
    seconds: float
    cpu: float
    load: float

    @property
    def rate(self) -> float:
        return self.written / self.seconds

    @property
    def cpu_rate(self) -> float:
        return self.written / self.cpu


async def produce(sink: Sink, template: Sample, args: argparse.Namespace) -> Run:
    """Run the episodes for `args.seconds`; samples written, wall and process CPU seconds."""
    stop = time.monotonic() + args.seconds
    written = 0

    async def episode(index: int) -> None:
        nonlocal written
        round_ = 0
        while time.monotonic() < stop:
            samples = []
            for call in range(args.calls):
                burn(args.burn_ms)
                await asyncio.sleep(0)  # the model call
                sid = f"ep{index}-{round_}/{call}"
                samples.append(dataclasses.replace(template, sample_id=sid, metadata={}))
            for sample in samples:
                sample.metadata["accepted_at"] = time.time()
            sink.write(samples)
            written += len(samples)
            round_ += 1

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(episode(i) for i in range(args.episodes)))
    return Run(written, time.monotonic() - started, time.process_time() - cpu, os.getloadavg()[0])


def other_cores() -> set[int]:
    """The cores this process is not pinned to (empty when it may use them all)."""
    if not hasattr(os, "sched_getaffinity"):
        return set()
    return set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_redis(args: argparse.Namespace, template: Sample, work: Path) -> dict[str, Any]:
    server = LocalRedisServer(appendfsync="everysec")
    server.start()
    assert server.process is not None
    if other_cores():  # the destination lives elsewhere
        os.sched_setaffinity(server.process.pid, other_cores())
    stream, done = "bench:delivery", work / "done"
    outs = [work / f"latencies-{i}.json" for i in range(args.consumers)]
    consumers = [
        subprocess.Popen(
            [sys.executable, "-c", CONSUMER, server.url, stream, f"t{i}", str(done), str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, out in enumerate(outs)
    ]
    for consumer in consumers:
        if other_cores():  # the trainers too
            os.sched_setaffinity(consumer.pid, other_cores())
    try:
        for consumer in consumers:
            assert consumer.stdout is not None
            consumer.stdout.readline()  # ready
        sink = open_sink(f"{server.url}?stream={stream}", spill_dir=work / "spill")
        assert isinstance(sink, BufferedSink)
        calls = 0
        stored: list[float] = []
        inner_write = sink.inner.write

        def timed_write(samples: Sequence[Sample]) -> None:
            nonlocal calls
            calls += 1
            inner_write(samples)
            now = time.time()
            stored.extend(now - s.metadata["accepted_at"] for s in samples)

        sink.inner.write = timed_write  # type: ignore[method-assign]
        run = asyncio.run(produce(sink, template, args))
        sink.close()
        done.write_text("done")
        latencies: list[float] = []
        for consumer, out in zip(consumers, outs, strict=True):
            consumer.wait(timeout=120)
            latencies += json.loads(out.read_text())
    finally:
        for consumer in consumers:
            if consumer.poll() is None:
                consumer.kill()
            consumer.communicate()
        server.cleanup()
    return {
        "run": run,
        "received": len(latencies),
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "stored_p50": percentile(stored, 0.5),
        "stored_p99": percentile(stored, 0.99),
        "spilled": sink.stats.spilled,
        "paced": getattr(sink.stats, "paced_writes", 0),  # also on releases before pacing
        "calls": calls,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--burn-ms", type=float, default=0.3)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--cpu", type=int, default=0, help="core to pin the producer to; -1: none")
    args = parser.parse_args()
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu % (os.cpu_count() or 1)})
    template = synthetic_sample(0, args.tokens)
    work = Path(tempfile.mkdtemp(prefix="tito-bench-delivery-"))
    base = asyncio.run(produce(NullSink(), template, args))
    result = run_redis(args, template, work)
    run: Run = result["run"]
    ok = result["p99"] < P99_TARGET and result["spilled"] == 0
    ok &= result["received"] >= run.written  # duplicates are removed by the readers
    print(
        f"\n== delivery from one CPU-bound producer: {args.episodes} episodes x "
        f"{args.calls} calls, {args.tokens // 1024}k-token samples, {args.burn_ms} ms of Python "
        f"per call, producer pinned to one core, {args.consumers} consumers =="
    )
    print(
        f"  sink keeping nothing:   {base.rate:>7,.0f} samples/s  {base.cpu_rate:>7,.0f} per "
        f"CPU-s  (load {base.load:.2f})"
    )
    print(
        f"  BufferedSink -> Redis:  {run.rate:>7,.0f} samples/s  {run.cpu_rate:>7,.0f} per CPU-s"
        f"  (load {run.load:.2f})  ratio {run.rate / base.rate:.2f} wall, "
        f"{run.cpu_rate / base.cpu_rate:.2f} per CPU-s"
    )
    print(
        f"  accept->consumer p50 {result['p50']:.3f}s p99 {result['p99']:.3f}s   accept->stored "
        f"p50 {result['stored_p50']:.3f}s p99 {result['stored_p99']:.3f}s   spilled "
        f"{result['spilled']}   received {result['received']}/{run.written}   inner.write calls "
        f"{result['calls']} ({run.written / max(1, result['calls']):.0f} samples each)   paced "
        f"writes {result['paced']}"
    )
    print(
        f"  target: consumer p99 < {P99_TARGET:.0f}s, nothing spilled, everything received: "
        f"{'PASS' if ok else 'FAIL'}"
    )
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
