"""Token-in sessions: how often merged samples break without them, and what they cost.

Runs the same multi-turn tool-calling agent with and without sessions, side by side, against a
vLLM-compatible server on loopback (by default the fake vLLM in a separate process, with realistic
tokenization drift; `--base-url` points it at a real vLLM instead) and prints:
  * prefix breaks: turns whose prompt does not extend the previous prompt + sampled ids (each one
    splits a merged sample), per mode;
  * added latency per call from the session (/tokenize round trips, bookkeeping), timed in the
    transport around the session plan (generation time differs between the two runs, so a
    difference of whole-call times would measure sampling, not the session); target < 5 ms.
Usage: python benchmarks/bench_sessions.py [--episodes N] [--base-url URL] [--check]
"""

from __future__ import annotations

import argparse
import itertools
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import numpy as np
import openai

import tito_agents as tito

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_episode(
    client: openai.OpenAI,
    collector: tito.Collector,
    model: str,
    i: int,
    sessions: bool,
    max_tokens: int,
) -> tuple[tito.Episode, list[float]]:
    """Tool call, tool result, answer, follow-up question, answer: four appended turns."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"What is the weather in city number {i}?"},
    ]
    times: list[float] = []
    with collector.episode(f"ep{i}", sessions=sessions) as ep:
        for turn in range(4):
            start = time.perf_counter()
            response = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=TOOLS,
                max_tokens=max_tokens,
                temperature=1.0,
                seed=1000 * i + turn,
                tool_choice="required" if turn == 0 else "auto",
            )
            times.append(time.perf_counter() - start)
            message = response.choices[0].message
            messages.append(
                message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
            )
            for call in message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C, sunny"})
            if not message.tool_calls:
                messages.append({"role": "user", "content": "And tomorrow?"})
    return ep, times


def breaks(ep: tito.Episode) -> int:
    calls = sorted(ep.calls, key=lambda c: c.seq)
    count = 0
    for prev, nxt in itertools.pairwise(calls):
        head = np.concatenate((prev.prompt_ids, prev.sampled_ids))
        n = head.shape[0]
        if not (nxt.prompt_ids.shape[0] >= n and np.array_equal(nxt.prompt_ids[:n], head)):
            count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--base-url", default=None, help="a real vLLM (default: the fake)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()

    server = None
    base_url = args.base_url
    if base_url is None:
        port = free_port()
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tito_agents.testing.fake_vllm",
                "--port",
                str(port),
                "--tokenization",
                "drift",
                "--drift-rate",
                "0.3",
            ],
            stdout=subprocess.PIPE,
        )
        base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                httpx.get(f"{base_url}/models", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
    try:
        collector = tito.Collector()
        client = collector.wrap(openai.OpenAI(base_url=base_url, api_key="EMPTY", timeout=600))
        model = client.models.list().data[0].id
        results: dict[bool, list[tuple[tito.Episode, list[float]]]] = {False: [], True: []}
        for i in range(args.episodes):
            for sessions in (False, True) if i % 2 == 0 else (True, False):
                results[sessions].append(
                    run_episode(client, collector, model, i, sessions, args.max_tokens)
                )
        client.close()
    finally:
        if server is not None:
            server.terminate()
            server.wait()

    print(f"\n== token-in sessions, {args.episodes} episodes x 4 turns, {base_url} ==")
    print(f"  {'mode':<16}{'calls':>8}{'prefix breaks':>16}{'episodes broken':>18}")
    for sessions in (False, True):
        eps = [ep for ep, _ in results[sessions]]
        calls = sum(len(ep.calls) for ep in eps)
        brk = [breaks(ep) for ep in eps]
        label = "sessions" if sessions else "no sessions"
        print(f"  {label:<16}{calls:>8}{sum(brk):>16}{sum(b > 0 for b in brk):>18}")
    added = [
        c.session_ms
        for ep, _ in results[True]
        for c in ep.calls
        if c.session_ms is not None and c.session != "first"
    ]
    median = statistics.median(added) if added else float("nan")
    ok = median < 5.0
    print(
        f"  added latency per call from sessions (/tokenize round trips + bookkeeping, measured "
        f"in the transport): median {median:.2f} ms over {len(added)} calls (target < 5 ms) "
        f"{'PASS' if ok else 'FAIL'}"
    )
    session_breaks = sum(breaks(ep) for ep, _ in results[True])
    print(
        f"  sessions keep every turn an exact prefix: {'PASS' if session_breaks == 0 else 'FAIL'}"
    )
    return 0 if (ok and session_breaks == 0) or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
