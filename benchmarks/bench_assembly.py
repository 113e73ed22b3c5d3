"""Benchmark: merged assembly of a 50-turn, 64k-token episode, beside a naive pure-Python version.

    python benchmarks/bench_assembly.py            # report only, exit 0
    python benchmarks/bench_assembly.py --check    # exit 1 when a target is missed

The episode: one agent, 50 calls; every prompt is the full history so far (a separate int32 array
per call, as the wire parser produces), the final sequence is 65,536 tokens. Variant "exact": every
prompt extends the previous prompt + sampled ids. Variant "diverging": also a retokenized tail, a
dropped special-delimited reasoning block and a removed early observation (3 extra samples).

Targets: prefix checks >= 50M tokens/s, merged assembly < 10 ms per episode. "Prefix checks" are the
comparisons `assemble_merged` does to decide that a prompt extends a tip: each prompt against the
previous prompt + sampled ids (numpy `array_equal` on slices, like `_Chain.extended_by`); the
naive version compares Python lists (`prompt[:n] == tip`) and finds rewrite points with a loop.
The naive version gets its lists for free (conversion not timed), which flatters it.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from tito_agents.assembly import AssemblyOptions, EpisodeContext, assemble_merged
from tito_agents.calls import Call, CallStatus, Endpoint

TURNS = 50
TOTAL_TOKENS = 65_536
FIRST_PROMPT = 1_024
SAMPLED_PER_TURN = 300
VOCAB = 49_152
THINK, END_THINK, EOS = 3, 4, 2
SPECIAL_IDS = (0, 1, 2, THINK, END_THINK)
RETOKENIZED_ID = 777
SPLIT_IDS = np.array([VOCAB, VOCAB + 1], dtype=np.int32)  # "007" + "77" == text of 777, "00777"
TEXTS = [f"{i:05d}" for i in range(VOCAB)] + ["007", "77"]
TEXTS[THINK], TEXTS[END_THINK], TEXTS[EOS] = "<think>", "</think>", "<|im_end|>"
TARGET_TOKENS_PER_S = 50e6
TARGET_MS = 10.0


def build_episode(diverging: bool, seed: int = 0) -> list[Call]:
    """50 calls whose prompts are the growing history; optionally with three injected divergences."""
    rng = np.random.default_rng(seed)
    observation = (TOTAL_TOKENS - FIRST_PROMPT - TURNS * SAMPLED_PER_TURN) // (TURNS - 1)
    history = rng.integers(5, VOCAB, FIRST_PROMPT, dtype=np.int32)
    calls = []
    for turn in range(TURNS):
        sampled = rng.integers(5, VOCAB, SAMPLED_PER_TURN, dtype=np.int32)
        sampled[-1] = EOS
        if diverging and turn == 29:
            sampled[:8] = [THINK, 7, 8, 9, 10, 11, 12, END_THINK]
        if turn == TURNS - 1:  # pad the last completion to land on exactly TOTAL_TOKENS
            extra = TOTAL_TOKENS - history.shape[0] - SAMPLED_PER_TURN
            sampled = np.concatenate((rng.integers(5, VOCAB, extra, dtype=np.int32), sampled))
        calls.append(_call(turn, history, sampled))
        rendered = sampled
        if diverging and turn == 9:  # retokenized tail: one sampled id re-encoded as two
            at = SAMPLED_PER_TURN // 2
            sampled[at] = RETOKENIZED_ID
            rendered = np.concatenate((sampled[:at], SPLIT_IDS, sampled[at + 1 :]))
        if diverging and turn == 29:  # the template drops the reasoning block
            rendered = sampled[8:]
        obs = rng.integers(5, VOCAB, observation, dtype=np.int32)
        history = np.concatenate((history, rendered, obs))
        if diverging and turn == 39:  # memory trimming: an early observation is removed
            cut = FIRST_PROMPT + SAMPLED_PER_TURN
            history = np.concatenate((history[:cut], history[cut + observation :]))
    return calls


def decode(ids: Sequence[int]) -> str:
    """A toy tokenizer's decode (a table lookup), so the text classification runs too."""
    return "".join(map(TEXTS.__getitem__, ids))


OPTIONS = AssemblyOptions.of(decode=decode, special_ids=SPECIAL_IDS, eos_ids=[EOS])
EPISODE = EpisodeContext("bench", episode_reward=1.0)


def _call(turn: int, prompt: np.ndarray, sampled: np.ndarray) -> Call:
    return Call(
        call_id=f"chatcmpl-{turn}/0",
        request_id=f"chatcmpl-{turn}",
        endpoint=Endpoint.CHAT,
        choice_index=0,
        status=CallStatus.COMPLETE,
        prompt_ids=prompt.copy(),
        sampled_ids=sampled,
        logprobs=np.full(sampled.shape[0], -0.25, dtype=np.float32),
        finish_reason="stop",
        stop_reason=None,
        model="bench",
        http_status=200,
        stream=False,
        started_at=2.0 * turn,
        ended_at=2.0 * turn + 1.0,
        seq=turn,
    )


# ---- the naive pure-Python implementation (list-based prefix comparison) ----


def naive_merged(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a straightforward implementation does: Python lists, merge while the prefix holds."""
    samples: list[dict[str, Any]] = []
    tip: list[int] = []
    for call in calls:
        prompt, sampled, logprobs = call["prompt"], call["sampled"], call["logprobs"]
        if samples and prompt[: len(tip)] == tip:
            current = samples[-1]
            delta = len(prompt) - len(tip)
        else:
            if samples:
                point = 0
                while point < min(len(prompt), len(tip)) and prompt[point] == tip[point]:
                    point += 1
                samples[-1]["end_reason"] = f"diverged@{point}"
            current = {"token_ids": [], "loss_mask": [], "logprobs": [], "end_reason": "end"}
            samples.append(current)
            delta = len(prompt)
        current["token_ids"].extend(prompt[len(prompt) - delta :])
        current["loss_mask"].extend([0] * delta)
        current["logprobs"].extend([0.0] * delta)
        current["token_ids"].extend(sampled)
        current["loss_mask"].extend([1] * len(sampled))
        current["logprobs"].extend(logprobs)
        tip = prompt + sampled
    return samples


def naive_prefix_checks(calls: list[dict[str, Any]]) -> int:
    """Only the naive prefix checks; returns how many of them held."""
    held = 0
    for prev, call in itertools.pairwise(calls):
        tip = prev["prompt"] + prev["sampled"]
        held += call["prompt"][: len(tip)] == tip
    return held


def numpy_prefix_checks(calls: list[Call]) -> int:
    """Only the comparisons merged assembly makes to decide extension (as in `_Chain.extended_by`)."""
    held = 0
    for prev, call in itertools.pairwise(calls):
        head = prev.prompt_ids.shape[0]
        tip = head + prev.sampled_ids.shape[0]
        held += bool(
            np.array_equal(call.prompt_ids[:head], prev.prompt_ids)
            and np.array_equal(call.prompt_ids[head:tip], prev.sampled_ids)
        )
    return held


def compared_tokens(calls: list[Call]) -> int:
    return sum(
        min(c.prompt_ids.shape[0], p.num_sampled + p.prompt_ids.shape[0])
        for p, c in itertools.pairwise(calls)
    )


def measure(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn` (CPU time of this thread: robust on a busy machine)."""
    fn()  # warm-up
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.thread_time()
        fn()
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus)


def run(runs: int) -> bool:
    ok = True
    print(f"merged assembly: {TURNS} turns, {TOTAL_TOKENS:,}-token episode, median of {runs} runs")
    print("targets are judged on CPU time (wall time also counts waiting for a core when busy)")
    header = (
        f"{'variant':<10} {'impl':<6} {'samples':>7} {'wall ms':>9} {'cpu ms':>9} "
        f"{'prefix Mtok/s':>14}"
    )
    print(header)
    print("-" * len(header))
    for variant in ("exact", "diverging"):
        calls = build_episode(variant == "diverging")
        lists = [
            {
                "prompt": c.prompt_ids.tolist(),
                "sampled": c.sampled_ids.tolist(),
                "logprobs": [] if c.logprobs is None else c.logprobs.tolist(),
            }
            for c in calls
        ]

        def fast(calls: list[Call] = calls) -> object:
            return assemble_merged(calls, EPISODE, OPTIONS)

        samples, divergences = assemble_merged(calls, EPISODE, OPTIONS)
        naive = naive_merged(lists)
        assert len(samples) == len(naive) == (4 if variant == "diverging" else 1)
        assert variant == "diverging" or samples[0].num_tokens == TOTAL_TOKENS
        for merged, slow in zip(samples, naive, strict=True):  # both give the same samples
            assert merged.token_ids.tolist() == slow["token_ids"]
            assert merged.loss_mask.tolist() == slow["loss_mask"]
        tokens = compared_tokens(calls)

        slow_runs = max(3, runs // 5)
        fast_wall, fast_cpu = measure(fast, runs)
        _, fast_prefix = measure(functools.partial(numpy_prefix_checks, calls), runs)
        slow_wall, slow_cpu = measure(functools.partial(naive_merged, lists), slow_runs)
        _, slow_prefix = measure(functools.partial(naive_prefix_checks, lists), slow_runs)

        rate = tokens / fast_prefix
        passed = rate >= TARGET_TOKENS_PER_S and fast_cpu * 1e3 < TARGET_MS
        ok &= passed
        kinds = ", ".join(d.kind.value for d in divergences) or "none"
        print(
            f"{variant:<10} {'numpy':<6} {len(samples):>7} {fast_wall * 1e3:>9.2f} "
            f"{fast_cpu * 1e3:>9.2f} {rate / 1e6:>14,.0f}  {'PASS' if passed else 'FAIL'}"
        )
        print(
            f"{'':<10} {'naive':<6} {len(naive):>7} {slow_wall * 1e3:>9.2f} "
            f"{slow_cpu * 1e3:>9.2f} {tokens / slow_prefix / 1e6:>14,.0f}"
        )
        print(
            f"{'':<10} numpy/naive: {slow_cpu / fast_cpu:.0f}x per episode, "
            f"{slow_prefix / fast_prefix:.0f}x on prefix checks; {tokens:,} ids compared "
            f"({tokens / fast_cpu / 1e6:,.0f} Mtok/s over the whole assembly); divergences: {kinds}"
        )
    print(
        f"targets: prefix checks >= {TARGET_TOKENS_PER_S / 1e6:.0f}M tokens/s and "
        f"< {TARGET_MS:.0f} ms per episode: {'PASS' if ok else 'FAIL'}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--runs", type=int, default=21, help="timed runs per measurement")
    args = parser.parse_args()
    ok = run(args.runs)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
