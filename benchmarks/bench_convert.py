"""Benchmark: collating samples into a padded batch, vectorized vs a per-sample Python loop.

    python benchmarks/bench_convert.py            # report only, exit 0
    python benchmarks/bench_convert.py --check    # exit 1 when a target is missed

Batch: 1,024 samples of up to 8,192 tokens (lengths 7,168..8,192, so rows really pad), each with
ids, a loss mask (~40 % trained, in spans) and rollout logprobs. Target: `pad_batch`
(input_ids, attention_mask, position_ids, loss_mask, logprobs) >= 5x faster than a per-sample Python
loop doing the same work in the same run. The loop is the usual glue code: each sample's arrays
turned into lists, padded with list arithmetic, one `np.array` per field at the end. Both results
are compared for equality before timing counts. For information only: a per-sample numpy loop
(`np.pad` per row, `np.stack`), the verl split layout, packing, and the torch hand-off.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tito_agents.convert import pack_batch, pad_batch, to_verl_batch, torch_available
from tito_agents.samples import CallSpan, Sample

TARGET_RATIO = 5.0


def make_samples(count: int, max_tokens: int, seed: int = 0) -> list[Sample]:
    """`count` samples of `max_tokens - U(0, max_tokens / 8)` tokens: a prompt of 1/4, then
    alternating sampled and context spans."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        n = max_tokens - int(rng.integers(0, max_tokens // 8 + 1))
        ids = rng.integers(0, 50_000, size=n, dtype=np.int32)
        mask = np.zeros(n, dtype=np.uint8)
        spans = []
        pos = n // 4
        while pos < n:
            end = min(n, pos + int(rng.integers(64, 512)))
            mask[pos:end] = 1
            spans.append(CallSpan(f"c{i}-{len(spans)}", 0, pos, end))
            pos = end + int(rng.integers(32, 256))
        logprobs = np.where(mask == 1, -rng.random(n, dtype=np.float32), 0.0).astype(np.float32)
        samples.append(
            Sample(
                sample_id=f"s{i}",
                episode_id=f"e{i}",
                agent="main",
                token_ids=ids,
                loss_mask=mask,
                logprobs=logprobs,
                reward=float(i % 2),
                call_ids=[s.call_id for s in spans],
                spans=spans,
                group_id=f"g{i // 8}",
            )
        )
    return samples


def python_loop_pad(samples: Sequence[Sample], pad_id: int = 0) -> dict[str, np.ndarray]:
    """The per-sample Python loop: lists per sample, list padding, one array per field."""
    width = max(s.num_tokens for s in samples)
    ids, attention, positions, loss, logprobs = [], [], [], [], []
    for sample in samples:
        n = sample.num_tokens
        pad = width - n
        assert sample.logprobs is not None
        ids.append(sample.token_ids.tolist() + [pad_id] * pad)
        attention.append([1] * n + [0] * pad)
        positions.append(list(range(n)) + [n - 1] * pad)
        loss.append(sample.loss_mask.tolist() + [0] * pad)
        logprobs.append(sample.logprobs.tolist() + [0.0] * pad)
    return {
        "input_ids": np.array(ids, dtype=np.int32),
        "attention_mask": np.array(attention, dtype=np.uint8),
        "position_ids": np.array(positions, dtype=np.int32),
        "loss_mask": np.array(loss, dtype=np.uint8),
        "logprobs": np.array(logprobs, dtype=np.float32),
    }


def numpy_loop_pad(samples: Sequence[Sample], pad_id: int = 0) -> dict[str, np.ndarray]:
    """A per-sample numpy loop (np.pad per row, np.stack): information only."""
    width = max(s.num_tokens for s in samples)
    rows: dict[str, list[np.ndarray]] = {k: [] for k in ("ids", "att", "pos", "loss", "lp")}
    for sample in samples:
        n = sample.num_tokens
        pad = (0, width - n)
        assert sample.logprobs is not None
        rows["ids"].append(np.pad(sample.token_ids, pad, constant_values=pad_id))
        rows["att"].append(np.pad(np.ones(n, np.uint8), pad))
        rows["pos"].append(np.pad(np.arange(n, dtype=np.int32), pad, mode="edge"))
        rows["loss"].append(np.pad(sample.loss_mask, pad))
        rows["lp"].append(np.pad(sample.logprobs, pad))
    return {
        "input_ids": np.stack(rows["ids"]),
        "attention_mask": np.stack(rows["att"]),
        "position_ids": np.stack(rows["pos"]),
        "loss_mask": np.stack(rows["loss"]),
        "logprobs": np.stack(rows["lp"]),
    }


def best_of(rounds: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Best wall time over `rounds` runs (the least disturbed by other load), and the last result."""
    times = []
    result = None
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
        result = None
    start = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - start)
    return min(times), result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of the fast paths")
    args = parser.parse_args()

    samples = make_samples(args.samples, args.tokens)
    total = sum(s.num_tokens for s in samples)
    fast_s, fast = best_of(args.rounds, lambda: pad_batch(samples).arrays())
    slow_s, slow = best_of(1, lambda: python_loop_pad(samples))
    same = all(np.array_equal(fast[k], slow[k]) for k in slow)
    del slow
    np_s, by_numpy = best_of(1, lambda: numpy_loop_pad(samples))
    same &= all(np.array_equal(fast[k], by_numpy[k]) for k in by_numpy)
    del by_numpy, fast
    ratio = slow_s / fast_s

    verl_s, _ = best_of(args.rounds, lambda: to_verl_batch(samples))
    pack_s, _ = best_of(args.rounds, lambda: pack_batch(samples))
    info = [
        ("per-sample numpy loop (np.pad + np.stack), information", np_s),
        ("to_verl_batch (prompt left / response right + rm_scores + uid)", verl_s),
        ("pack_batch (cu_seqlens, position resets)", pack_s),
    ]
    if torch_available():
        batch = pad_batch(samples)
        torch_s, _ = best_of(args.rounds, batch.to_torch)
        info.append(("PaddedBatch.to_torch (int64 ids/masks/positions)", torch_s))

    passed = same and ratio >= TARGET_RATIO
    print(f"\n== padded collation: {args.samples} samples, {total:,} tokens ==")
    print(
        f"  {'pad_batch (vectorized: one array per field, a slice copy per row)':<68} {fast_s * 1e3:9.1f} ms"
    )
    print(
        f"  {'per-sample Python loop (lists, list padding, np.array)':<68} {slow_s * 1e3:9.1f} ms"
    )
    for name, seconds in info:
        print(f"  {name:<68} {seconds * 1e3:9.1f} ms")
    print(f"  outputs identical: {same}")
    print(
        f"  {'speed-up of pad_batch over the Python loop':<68} {ratio:8.1f}x"
        f"   target >= {TARGET_RATIO:.0f}x   {'PASS' if passed else 'FAIL'}"
    )
    return 0 if passed or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
