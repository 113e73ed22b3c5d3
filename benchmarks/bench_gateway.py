"""The capture gateway side by side with a bare pass-through proxy on the same stack
and with the client calling the server directly, in one run.

Upstream: benchmarks/canned_server.py (answers instantly, so nothing but the HTTP hops and the
capture work remains — the worst case for relative overhead), streams sent as vLLM sends them,
one HTTP chunk per event. The gateway is `tito-agents
serve` (calls outside any episode: each is assembled and written to a JSON Lines sink by its
processor's thread, inside the measured process); the pass-through is benchmarks/gateway_passthrough.py.
The client is the openai package's AsyncOpenAI, asking for the ids itself, so every hop carries
the same bytes and the difference is the gateway's own work.

Per target, JSON and SSE, at concurrency 1 and 64: client CPU per call, proxy CPU per call (its
process tree, from /proc), median latency, and for SSE the median time to first chunk.
Rounds interleave the targets; ratios are medians of per-round ratios.
Targets: gateway CPU per call <= 1.3x the pass-through's; SSE time to first chunk within 1 ms of
the pass-through's (concurrency 1).
Where Agent Lightning's proxy is installed in its own venv (benchmarks/agl_proxy.py --setup, or
TITO_AGL_PYTHON names its python), a fourth target measured the same way, without targets; it
refuses streams (HTTP 400), so for SSE the run counts its refused calls instead of failing.
Usage: python benchmarks/bench_gateway.py [--check] [--rounds N] [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
from agl_proxy import AGL_VENV, BASE_PATH, agl_python

HERE = Path(__file__).resolve().parent
PROMPT, COMPLETION = 2048, 256
MSG = [{"role": "user", "content": "benchmark"}]
CPU_TARGET, TTFB_TARGET_MS = 1.3, 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu(pid: int) -> float:
    """CPU seconds of a process, all its live threads, to the nanosecond (schedstat: /proc/PID/stat
    counts 10 ms ticks, too coarse for a few dozen calls of a few ms)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            continue
    return total / 1e9


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live descendants."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += process_cpu(current)
            for task in Path(f"/proc/{current}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):  # a process that just ended
            continue
    return total


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def one_call(client: openai.AsyncOpenAI, stream: bool) -> tuple[float, float | None]:
    """(latency, time to first chunk) of one call, in seconds."""
    start = time.perf_counter()
    extra = {"return_token_ids": True}
    if not stream:
        await client.chat.completions.create(
            model="bench", messages=MSG, max_tokens=COMPLETION, extra_body=extra
        )
        return time.perf_counter() - start, None
    first = None
    response = await client.chat.completions.create(
        model="bench", messages=MSG, max_tokens=COMPLETION, stream=True, extra_body=extra
    )
    async for _ in response:
        if first is None:
            first = time.perf_counter() - start
    return time.perf_counter() - start, first


async def run_round(
    client: openai.AsyncOpenAI,
    pid: int | None,
    stream: bool,
    concurrency: int,
    calls: int,
    refusable: bool = False,
) -> dict[str, float]:
    """Figures of one round. With `refusable` (Agent Lightning's proxy, which answers HTTP 400 to
    `stream: true`), calls refused with HTTP 400 are counted in `refused` instead of failing the
    run, and with all refused the other figures are NaN."""
    gc.collect()
    queue = list(range(calls))
    results: list[tuple[float, float | None]] = []
    refused = 0

    async def worker() -> None:
        nonlocal refused
        while queue:
            queue.pop()
            try:
                results.append(await one_call(client, stream))
            except openai.BadRequestError:
                if not refusable:
                    raise
                refused += 1

    cpu, proxy = time.process_time(), tree_cpu(pid) if pid else 0.0
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    client_cpu = time.process_time() - cpu
    proxy_cpu = (tree_cpu(pid) - proxy) if pid else 0.0
    firsts = [f for _, f in results if f is not None]
    nan = float("nan")
    served = len(results)
    return {
        "client_ms": 1000 * client_cpu / served if served else nan,
        "proxy_ms": 1000 * proxy_cpu / served if served else nan,
        "latency_ms": 1000 * statistics.median(r for r, _ in results) if served else nan,
        "ttfb_ms": 1000 * statistics.median(firsts) if firsts else nan,
        "calls_per_s": served / wall,
        "refused": refused,
        "calls": calls,
    }


async def measure(
    targets: dict[str, tuple[str, int | None]], rounds: int, calls: int
) -> dict[tuple[str, bool, int], list[dict[str, float]]]:
    clients = {
        name: openai.AsyncOpenAI(
            base_url=url,
            api_key="x",
            max_retries=2,  # a rare connection reset on a loaded machine is retried, not fatal
            http_client=openai.DefaultAsyncHttpxClient(
                timeout=openai.Timeout(600, connect=120),
                limits=type(openai.DEFAULT_CONNECTION_LIMITS)(
                    max_connections=128, max_keepalive_connections=128
                ),
            ),
        )
        for name, (url, _) in targets.items()
    }
    out: dict[tuple[str, bool, int], list[dict[str, float]]] = {}
    names = list(targets)
    for stream in (False, True):
        for concurrency in (1, 64):
            n = calls if concurrency == 1 else calls * 4
            for name in names:  # warm connections and code paths
                await run_round(clients[name], None, stream, concurrency, min(n, 64), name == "agl")
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    pid = targets[name][1]
                    result = await run_round(
                        clients[name], pid, stream, concurrency, n, name == "agl"
                    )
                    out.setdefault((name, stream, concurrency), []).append(result)
    for client in clients.values():
        await client.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=48, help="calls per round at concurrency 1")
    args = parser.parse_args()
    agl = agl_python()
    if agl is None:
        print(
            f"Agent Lightning column skipped: no venv at {AGL_VENV} (create it with "
            "`python benchmarks/agl_proxy.py --setup PYTHON3.12`, or set TITO_AGL_PYTHON)"
        )
    ports = {name: free_port() for name in ("canned", "passthrough", "gateway", "agl")}
    root = f"http://127.0.0.1:{ports['canned']}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    env = {**os.environ, "TITO_GATEWAY_TOKEN": "bench-token"}
    commands = {
        "canned": [sys.executable, str(HERE / "canned_server.py"), str(ports["canned"]),
                   str(PROMPT), str(COMPLETION), "0"],
        "passthrough": [sys.executable, str(HERE / "gateway_passthrough.py"),
                        str(ports["passthrough"]), root],
        "gateway": [sys.executable, "-m", "tito_agents.cli", "serve", "--upstream", root,
                    "--port", str(ports["gateway"]), "--sink", str(tmp / "samples.jsonl"),
                    "--no-state", "--log-level", "warning", "--connect-timeout", "60"],
    }  # fmt: skip
    if agl is not None:
        commands["agl"] = [str(agl), str(HERE / "agl_proxy.py"), str(ports["agl"]), root]
    processes = {
        name: subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        for name, cmd in commands.items()
    }
    try:
        wait_ready(f"{root}/v1/models", processes["canned"])
        for name in ("passthrough", "gateway"):
            wait_ready(f"http://127.0.0.1:{ports[name]}/v1/models", processes[name])
        targets = {
            "direct": (f"{root}/v1", None),
            "passthrough": (f"http://127.0.0.1:{ports['passthrough']}/v1", processes["passthrough"].pid),
            "gateway": (f"http://127.0.0.1:{ports['gateway']}/v1", processes["gateway"].pid),
        }  # fmt: skip
        if "agl" in processes:
            try:
                wait_ready(f"http://127.0.0.1:{ports['agl']}/healthz", processes["agl"])
                targets["agl"] = (
                    f"http://127.0.0.1:{ports['agl']}{BASE_PATH}",
                    processes["agl"].pid,
                )
            except RuntimeError as exc:  # informational column: never fails the benchmark
                print(f"Agent Lightning column skipped: its proxy did not start ({exc})")
        try:
            results = asyncio.run(measure(targets, args.rounds, args.calls))
        except Exception:
            gone = {n: p.poll() for n, p in processes.items() if p.poll() is not None}
            print(f"a call failed; processes that exited (name: code): {gone}", flush=True)
            raise
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.wait(timeout=60)
    return report(results, args.check, tmp / "samples.jsonl")


def report(
    results: dict[tuple[str, bool, int], list[dict[str, float]]], check: bool, sink: Path
) -> int:
    print(f"{PROMPT}-token prompts, {COMPLETION} sampled tokens; per call, medians over rounds")
    print(
        f"{'':23}{'client CPU':>11}{'proxy CPU':>10}{'total':>8}{'latency':>9}{'TTFB':>8}{'calls/s':>9}"
    )
    failed = []
    for stream in (False, True):
        for concurrency in (1, 64):
            kind = f"{'SSE' if stream else 'JSON'} c={concurrency}"
            rows = {}
            for name in ("direct", "passthrough", "gateway", "agl"):
                if (name, stream, concurrency) not in results:
                    continue
                rounds = results[(name, stream, concurrency)]
                refused = sum(int(r["refused"]) for r in rounds)
                if refused:
                    total_calls = sum(int(r["calls"]) for r in rounds)
                    print(f"{kind:10}{name:13}refused {refused} of {total_calls} calls (HTTP 400)")
                    if refused == total_calls:
                        continue
                row = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
                rows[name] = row
                total = row["client_ms"] + row["proxy_ms"]
                print(
                    f"{kind:10}{name:13}{row['client_ms']:9.3f}ms{row['proxy_ms']:8.3f}ms"
                    f"{total:7.3f}ms{row['latency_ms']:7.2f}ms"
                    f"{row['ttfb_ms']:6.2f}ms{row['calls_per_s']:9.0f}"
                )
            gw, pt = (
                results[("gateway", stream, concurrency)],
                results[("passthrough", stream, concurrency)],
            )
            cpu_ratio = statistics.median(
                g["proxy_ms"] / p["proxy_ms"] for g, p in zip(gw, pt, strict=True)
            )
            ok = cpu_ratio <= CPU_TARGET
            line = f"  gateway/pass-through proxy CPU per call: {cpu_ratio:.2f}x (<= {CPU_TARGET})"
            if stream and concurrency == 1:
                ttfb = statistics.median(
                    g["ttfb_ms"] - p["ttfb_ms"] for g, p in zip(gw, pt, strict=True)
                )
                ok_ttfb = ttfb <= TTFB_TARGET_MS
                line += f"; TTFB gateway - pass-through: {ttfb:+.3f} ms (<= {TTFB_TARGET_MS})"
                ok = ok and ok_ttfb
            print(line + ("  PASS" if ok else "  FAIL"))
            if not ok:
                failed.append(kind)
            if "agl" in rows:
                agl = results[("agl", stream, concurrency)]
                agl_ratio = statistics.median(
                    a["proxy_ms"] / p["proxy_ms"] for a, p in zip(agl, pt, strict=True)
                )
                agl_total = statistics.median(
                    (a["client_ms"] + a["proxy_ms"]) / (d["client_ms"] + d["proxy_ms"])
                    for a, d in zip(agl, results[("direct", stream, concurrency)], strict=True)
                )
                print(
                    f"  Agent Lightning/pass-through proxy CPU per call: {agl_ratio:.2f}x; "
                    f"client + proxy CPU vs direct: {agl_total:.2f}x (informational)"
                )
    samples = sum(1 for _ in sink.open("rb")) if sink.exists() else 0
    print(f"gateway wrote {samples} samples to {sink}")
    if failed:
        print(f"missed: {', '.join(failed)}")
    return 1 if failed and check else 0


if __name__ == "__main__":
    sys.exit(main())
