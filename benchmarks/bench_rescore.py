"""Re-scoring constrained calls: it never delays the agent's calls, and costs nothing on
calls that were not constrained. Side by side in one run, against the fake vLLM over HTTP (a
separate process, so its work is not counted in this one's CPU).

Each round runs the same episodes with `rescore_constrained` off and on, back to back (order
rotated): 8 concurrent episodes of 2 forced-tool calls and 1 free call each. Figures:
  * the agent's call latency, re-scoring on / off, for free calls and for constrained calls
    (median of per-round ratios; target <= 1.05: re-scoring runs at the episode's end, never inside
    a call);
  * this process's CPU per free call, on / off (target <= 1.05);
  * what re-scoring adds at the episode's end, per constrained call (reported, no target: one
    batched `/v1/completions` request per episode, a prefill of the call's ids on the server).
Episodes end together after all their calls, so the server work re-scoring adds at the end (real:
one prefill per constrained call) is reported apart from the calls' figures.
Usage: python benchmarks/bench_rescore.py [--check] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import openai

import tito_agents as tito

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
EPISODES = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_round(base_url: str, model: str, rescore: bool) -> dict[str, Any]:
    collector = tito.Collector(
        tito.sinks.CallbackSink(lambda batch: None),
        capture_logprobs=True,
        rescore_constrained=rescore,
    )
    client = collector.wrap(openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0))
    free: list[float] = []
    forced: list[float] = []
    ends: list[float] = []
    cpu_free: list[float] = []

    async def call(kind: list[float], **extra: Any) -> None:
        started, cpu = time.perf_counter(), time.process_time()
        await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            max_tokens=48,
            **extra,
        )
        kind.append(time.perf_counter() - started)
        if kind is free:
            cpu_free.append(time.process_time() - cpu)

    calls_done = asyncio.Barrier(EPISODES)

    async def episode() -> None:
        ep = collector.episode()
        await ep.__aenter__()
        await call(forced, tools=TOOLS, tool_choice="required")
        await call(forced, tools=TOOLS, tool_choice="required")
        await call(free)
        # episodes end together, after every call: what re-scoring costs the server and the
        # event loop at an episode's end is measured there, not mixed into the calls' figures
        await calls_done.wait()
        started = time.perf_counter()
        await ep.__aexit__(None, None, None)
        ends.append(time.perf_counter() - started)

    await asyncio.gather(*(episode() for _ in range(EPISODES)))
    await client.close()
    assert collector.stats.rescored_calls == (2 * EPISODES if rescore else 0), collector.stats
    return {
        "free": statistics.median(free),
        "forced": statistics.median(forced),
        "end": statistics.median(ends),
        "cpu_free": statistics.median(cpu_free),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tito_agents.testing.fake_vllm", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while True:
            try:
                model = httpx.get(f"{base_url}/models", timeout=2).json()["data"][0]["id"]
                break
            except (httpx.HTTPError, KeyError, ValueError):
                if time.time() > deadline or server.poll() is not None:
                    print("the fake vLLM did not start", file=sys.stderr)
                    return 1
                time.sleep(0.5)
        asyncio.run(run_round(base_url, model, False))  # warm up both paths
        asyncio.run(run_round(base_url, model, True))
        ratios: dict[str, list[float]] = {"free": [], "forced": [], "cpu_free": []}
        end_cost: list[float] = []
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {flag: asyncio.run(run_round(base_url, model, flag)) for flag in order}
            for key in ratios:
                ratios[key].append(got[True][key] / got[False][key])
            end_cost.append((got[True]["end"] - got[False]["end"]) / 2)
    finally:
        server.terminate()
        server.wait(timeout=30)

    rows = [
        ("free call latency, re-scoring on / off", statistics.median(ratios["free"]), 1.05),
        ("constrained call latency, on / off", statistics.median(ratios["forced"]), 1.05),
        ("CPU per free call, on / off", statistics.median(ratios["cpu_free"]), 1.05),
    ]
    print(f"re-scoring constrained calls ({args.rounds} rounds, {EPISODES} episodes each)")
    failed = False
    for name, value, target in rows:
        passed = value <= target
        failed |= not passed
        print(f"  {name:<48} {value:<10.3f} target <= {target:<6} {'PASS' if passed else 'FAIL'}")
    print(
        f"  {'added at the episode end, per constrained call':<48} "
        f"{statistics.median(end_cost) * 1000:.1f} ms (one batched request per episode; no target)"
    )
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
