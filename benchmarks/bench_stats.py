"""`tito-agents stats` streams at the reader's speed (target: >= 50% of merely reading).

Writes N samples of T tokens (per-call layout, real JSON Lines sink encoding, random ids) into a
temporary folder, then times, interleaved and best of `--rounds`:
  * read:  iterating `read_samples(path)` (the same reader `stats` uses) and doing nothing;
  * stats: `tito-agents stats PATH --json` in-process (the whole command, output discarded).
Prints sizes, seconds, samples/s, MB/s and the ratio read_time / stats_time (stats' speed as a share
of the reader's). The issue's full size, 100k samples of 8k tokens, is about 5 GB of JSON Lines and
several minutes per pass on a 2-core machine; the default is scaled down (`--full` for the real size).
Usage: python benchmarks/bench_stats.py [--samples N] [--tokens T] [--full] [--rounds R] [--check]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tito_agents.cli.main import main
from tito_agents.samples import CallSpan, Sample
from tito_agents.sinks.jsonl import encode_sample
from tito_agents.sinks.reading import read_samples

TARGET = 0.5
FULL_SAMPLES, FULL_TOKENS = 100_000, 8192
DEFAULT_SAMPLES = 4_000


def write_file(path: Path, samples: int, tokens: int) -> int:
    """Write `samples` samples of `tokens` tokens; returns the file size in bytes."""
    rng = np.random.default_rng(0)
    prompt = tokens * 3 // 4
    mask = np.zeros(tokens, dtype=np.uint8)
    mask[prompt:] = 1
    pool = rng.integers(0, 49_152, size=tokens * 8, dtype=np.int32)
    with open(path, "wb") as handle:
        for i in range(samples):
            offset = int(rng.integers(0, pool.shape[0] - tokens))
            sample = Sample(
                sample_id=f"s{i:08d}",
                episode_id=f"e{i // 4:08d}",
                agent="solver",
                token_ids=pool[offset : offset + tokens],
                loss_mask=mask,
                logprobs=None,
                reward=float(i % 3) / 2,
                call_ids=[f"r{i}/0"],
                spans=[CallSpan(f"r{i}/0", 0, prompt, tokens, "stop")],
                start_reason="call",
                end_reason="stop",
            )
            handle.write(encode_sample(sample))
    return path.stat().st_size


def time_read(path: Path) -> float:
    started = time.perf_counter()
    for _ in read_samples(path):
        pass
    return time.perf_counter() - started


def time_stats(path: Path) -> float:
    sink = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(sink):
        code = main(["stats", str(path), "--json"])
    elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"stats failed with exit code {code}")
    return elapsed


def main_bench() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--tokens", type=int, default=FULL_TOKENS)
    parser.add_argument("--full", action="store_true", help="100k samples of 8k tokens (~5 GB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", action="store_true", help=f"exit 1 below ratio {TARGET}")
    args = parser.parse_args()
    samples, tokens = (FULL_SAMPLES, FULL_TOKENS) if args.full else (args.samples, args.tokens)
    scaled = (samples, tokens) != (FULL_SAMPLES, FULL_TOKENS)
    with tempfile.TemporaryDirectory(prefix="bench-stats-") as folder:
        path = Path(folder) / "samples.jsonl"
        started = time.perf_counter()
        size = write_file(path, samples, tokens)
        print(
            f"file: {samples:,} samples x {tokens:,} tokens = {size / 1e6:,.0f} MB of JSON Lines "
            f"(written in {time.perf_counter() - started:.1f} s)"
            + (f"; scaled down from {FULL_SAMPLES:,} x {FULL_TOKENS:,} (--full)" if scaled else "")
        )
        time_read(path)  # warm the page cache: both timings read from memory
        reads, stats = [], []
        for round_index in range(args.rounds):  # alternate which goes first: no order bias
            if round_index % 2 == 0:
                reads.append(time_read(path))
                stats.append(time_stats(path))
            else:
                stats.append(time_stats(path))
                reads.append(time_read(path))
        read_s, stats_s = min(reads), min(stats)
        ratio = read_s / stats_s
        for name, seconds in (("read only", read_s), ("stats", stats_s)):
            print(
                f"{name:>10}: {seconds:7.2f} s  {samples / seconds:9,.0f} samples/s  "
                f"{size / 1e6 / seconds:7.1f} MB/s  (best of {args.rounds})"
            )
        verdict = "PASS" if ratio >= TARGET else "FAIL"
        print(f"ratio stats speed / read speed: {ratio:.3f} (target >= {TARGET}: {verdict})")
    return 0 if ratio >= TARGET or not args.check else 1


if __name__ == "__main__":
    sys.exit(main_bench())
