"""Sink throughput beside the raw library doing the same write, in the same run.

For 8k-token and 64k-token samples (random ids, 40% trained, logprobs captured), samples/s of:
  * Parquet parts (zstd, crash-safe journal, atomic finalize) vs pyarrow `ParquetWriter` (same
    options) writing the same record batches and fsyncing the file;
  * Arrow IPC parts vs a pyarrow IPC stream writer writing the same batches and fsyncing;
  * Redis Streams (one XADD per sample, 64 per round trip) vs redis-py pipelined XADD of the same
    arrays (64 per round trip), on a redis-server this script starts;
  * Ray (one `ray.put` and one actor call per batch of up to 256 samples / 32 MB) vs `ray.put`
    of the same batches;
each sink >= 80% of its raw figure. And JSON Lines with orjson (`JsonlSink`) >= 5x the standard
library `json` writing the same samples.

Both sides of a pair get the same input and build Arrow batches the same way, so the ratio
measures what the sink adds (journal, locking, finalize, framing, actor calls). Rounds alternate
raw and sink back to back (one untimed warm-up each, then up to 30 rounds within a time budget);
each side's figure is its best round, and the target applies to the ratio of the two figures.
The median of the per-round ratios is printed too: on a loaded machine the two can differ (a
sink with a helper thread gains when a core is free and loses when none is).
Usage: python benchmarks/bench_sinks.py [--check] [--rounds N] [--no-ray] [--no-redis]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tito_agents.samples import Sample
from tito_agents.sinks.harness import LocalRedisServer, synthetic_sample
from tito_agents.sinks.jsonl import JsonlSink

BATCH = 64
SIZES = {8192: 384, 65536: 96}  # tokens per sample -> samples per round
JSON_SIZES = {8192: 64, 65536: 6}  # the stdlib json side is slow: fewer samples
RAY_SIZES = {8192: 1024, 65536: 256}  # several batches per round, as in a sustained run
RATIO_TARGET = 0.80
JSON_TARGET = 5.0


@dataclass
class Row:
    name: str
    tokens: int
    raw: float
    sink: float
    target: float
    paired: float
    """Median sink/raw ratio of back-to-back rounds (shown beside the ratio of best figures)."""

    @property
    def ratio(self) -> float:
        return self.sink / self.raw if self.raw else 0.0

    @property
    def passed(self) -> bool:
        return self.ratio >= self.target


def chunks(samples: Sequence[Sample], size: int = BATCH) -> list[Sequence[Sample]]:
    return [samples[i : i + size] for i in range(0, len(samples), size)]


Timed = Callable[[], float]
"""One round: runs the write and returns the seconds it took (set-up excluded)."""


def timed(fn: Callable[[], None]) -> Timed:
    def run() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    return run


def compare(
    raw: Timed,
    sink: Timed,
    count: int,
    rounds: int,
    reset: Callable[[], None] = lambda: None,
    budget: float = 10.0,
) -> tuple[float, float, float]:
    """Best samples/s of raw and sink, and the median sink/raw ratio of back-to-back rounds: one
    untimed warm-up each, then alternating rounds (at least `rounds`, more while under `budget`
    seconds, at most 6x `rounds`)."""
    best = {"raw": 0.0, "sink": 0.0}
    ratios: list[float] = []
    started = time.monotonic()
    index = 0
    while index <= rounds or (time.monotonic() - started < budget and index <= 6 * rounds):
        rates: dict[str, float] = {}
        for side in ("raw", "sink") if index % 2 == 0 else ("sink", "raw"):
            reset()
            gc.collect()
            rates[side] = count / (raw if side == "raw" else sink)()
        if index:  # round 0 warms caches, imports and the object store
            for side, rate in rates.items():
                best[side] = max(best[side], rate)
            ratios.append(rates["sink"] / rates["raw"])
        index += 1
    reset()
    return best["raw"], best["sink"], statistics.median(ratios)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- files ----


def bench_files(samples: Sequence[Sample], tokens: int, rounds: int, folder: Path) -> list[Row]:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    from tito_agents.sinks import columnar
    from tito_agents.sinks.files import RotatingFileSink

    def reset() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    def raw_parquet() -> None:
        path = folder / "raw.parquet"
        with pq.ParquetWriter(str(path), columnar.SCHEMA, **columnar.parquet_options()) as out:
            for batch in chunks(samples):
                out.write_batch(columnar.samples_to_batch(batch))
        fsync_path(path)

    def raw_arrow() -> None:
        path = folder / "raw.arrow"
        with pa.OSFile(str(path), "wb") as handle:
            writer = pa.ipc.new_stream(handle, columnar.SCHEMA)
            for batch in chunks(samples):
                writer.write_batch(columnar.samples_to_batch(batch))
            writer.close()
        fsync_path(path)

    def sink_of(name: str) -> Timed:
        def run() -> None:
            sink = RotatingFileSink(folder / name, recover=False)
            for batch in chunks(samples):
                sink.write(batch)
            sink.close()

        return timed(run)

    rows = []
    raw, sink, paired = compare(
        timed(raw_parquet), sink_of("s.parquet"), len(samples), rounds, reset
    )
    name = "Parquet zstd parts vs pyarrow ParquetWriter"
    rows.append(Row(name, tokens, raw, sink, RATIO_TARGET, paired))
    raw, sink, paired = compare(timed(raw_arrow), sink_of("s.arrow"), len(samples), rounds, reset)
    rows.append(
        Row("Arrow IPC parts vs pyarrow IPC stream", tokens, raw, sink, RATIO_TARGET, paired)
    )
    return rows


def bench_jsonl(samples: Sequence[Sample], tokens: int, rounds: int, folder: Path) -> Row:
    def reset() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    def stdlib() -> None:
        with open(folder / "std.jsonl", "w") as handle:
            for sample in samples:
                data = sample.to_dict()
                for key in ("token_ids", "loss_mask", "logprobs"):
                    if data[key] is not None:
                        data[key] = data[key].tolist()
                handle.write(json.dumps(data) + "\n")

    def orjson_sink() -> None:
        sink = JsonlSink(folder / "fast.jsonl")
        for batch in chunks(samples):
            sink.write(batch)
        sink.close()

    raw, sink, paired = compare(timed(stdlib), timed(orjson_sink), len(samples), rounds, reset, 1.5)
    name = "JSON Lines: JsonlSink (orjson) vs stdlib json"
    return Row(name, tokens, raw, sink, JSON_TARGET, paired)


# ---- redis ----


def bench_redis(samples: Sequence[Sample], tokens: int, rounds: int, url: str) -> Row:
    import redis

    from tito_agents.sinks.redis_streams import RedisStreamSink

    client = redis.Redis.from_url(url)
    stream = "bench:samples"

    def reset() -> None:
        client.delete(stream)

    def raw() -> None:
        for batch in chunks(samples):
            pipe = client.pipeline(transaction=False)
            for s in batch:
                arrays: dict[str, Any] = {
                    "token_ids": s.token_ids,
                    "loss_mask": s.loss_mask,
                    "logprobs": s.logprobs,
                }
                fields: Any = {"sid": s.sample_id}
                for key, array in arrays.items():
                    if array is not None:
                        fields[key] = memoryview(array).cast("B")
                pipe.xadd(stream, fields)
            pipe.execute()

    sink = RedisStreamSink(client=client, stream=stream, batch_size=BATCH)

    def ours() -> None:
        for batch in chunks(samples):
            sink.write(batch)

    best_raw, best_sink, paired = compare(timed(raw), timed(ours), len(samples), rounds, reset)
    sink.close()
    client.close()
    name = "Redis XADD per sample vs redis-py pipelined XADD"
    return Row(name, tokens, best_raw, best_sink, RATIO_TARGET, paired)


# ---- ray ----


def bench_ray(samples: Sequence[Sample], tokens: int, rounds: int) -> Row:
    import ray

    from tito_agents.sinks.ray_actor import split_batches
    from tito_agents.sinks.ray_queue import RayReader, RaySink

    held: list[Any] = []
    name = f"bench-{tokens}"
    sink = RaySink(name, namespace="tito-bench", capacity=4 * len(samples))
    batches = list(split_batches(samples, sink.batch_size, sink.batch_bytes))
    reader = RayReader(name, namespace="tito-bench", capacity=4 * len(samples))
    sink.flush()  # the actor is up: its start is a one-off, not per sample

    def raw() -> float:
        started = time.perf_counter()
        for batch in batches:  # the same batches the sink makes
            held.append(ray.put([s.to_dict() for s in batch]))
        return time.perf_counter() - started

    def ours() -> float:
        started = time.perf_counter()
        sink.write(samples)
        sink.flush()
        elapsed = time.perf_counter() - started
        taken = 0
        while taken < len(samples):  # untimed: empty the queue for the next round
            taken += len(reader.read(len(samples), timeout=5))
        reader.deduper = type(reader.deduper)(reader.deduper.window)  # the same ids come again
        sink.flush()  # untimed: the sink learns they were consumed and releases its references
        return elapsed

    try:
        best_raw, best_sink, paired = compare(raw, ours, len(samples), rounds, held.clear)
    finally:
        sink.close()
        ray.kill(sink._actor)
    label = f"Ray (ray.put + actor call, {len(batches)} batches) vs ray.put"
    return Row(label, tokens, best_raw, best_sink, RATIO_TARGET, paired)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--rounds", type=int, default=5, help="minimum rounds per pair")
    parser.add_argument("--no-ray", action="store_true", help="skip Ray (its start takes ~20 s)")
    parser.add_argument("--no-redis", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tito-bench-sinks-"))
    rows: list[Row] = []
    skipped: list[str] = []
    server: LocalRedisServer | None = None
    ray_up = False
    try:
        if not args.no_redis:
            try:
                server = LocalRedisServer(appendfsync="no")
                server.start()
            except Exception as exc:
                skipped.append(f"Redis: {exc}")
                server = None
        if not args.no_ray:
            try:
                import ray

                ray.init(
                    num_cpus=1,
                    include_dashboard=False,
                    log_to_driver=False,
                    object_store_memory=1024 * 1024 * 1024,
                )
                ray_up = True
            except ImportError:
                skipped.append("Ray: not installed (pip install ray)")
        for tokens, count in SIZES.items():
            samples = [synthetic_sample(i, tokens) for i in range(count)]
            try:
                rows += bench_files(samples, tokens, args.rounds, work / "files")
            except ImportError:
                skipped.append("Parquet/Arrow: pyarrow not installed")
            rows.append(bench_jsonl(samples[: JSON_SIZES[tokens]], tokens, 3, work / "jsonl"))
            if server is not None:
                rows.append(bench_redis(samples, tokens, args.rounds, server.url))
            if ray_up:
                more = [synthetic_sample(i, tokens) for i in range(count, RAY_SIZES[tokens])]
                rows.append(bench_ray(samples + more, tokens, args.rounds))
                del more
    finally:
        if server is not None:
            server.cleanup()
        if ray_up:
            import ray

            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    print("\n== sinks at scale: samples/s, best round of each side ==")
    ok = True
    for row in rows:
        ok &= row.passed
        target = f">= {row.target:.0%}" if row.target < 1 else f">= {row.target:.0f}x"
        print(
            f"  {row.name:<52} {row.tokens // 1024:>3}k tok  raw {row.raw:>9,.0f}/s  "
            f"sink {row.sink:>9,.0f}/s  ratio {row.ratio:5.2f} (paired median {row.paired:5.2f})  "
            f"target {target:<6} {'PASS' if row.passed else 'FAIL'}"
        )
    for reason in skipped:
        print(f"  SKIP {reason}")
    print(f"  ({time.monotonic() - started:.0f} s)")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
