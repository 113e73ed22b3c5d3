"""`tito-agents serve` as a process: 256 concurrent streams over many episodes (no loss, no
cross-episode leak, bounded memory), restarts (open episodes reported lost, nothing half
written), and `curl` as the client."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.gateway_harness import Control, echo_responder, serve_cli
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer

EPISODES, STREAMS_PER_EPISODE = 32, 8  # 256 streams at once


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=echo_responder)) as server:
        yield server


def samples_in(path: Path) -> list[dict[str, object]]:
    lines = path.read_bytes().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_256_concurrent_streams_no_loss_no_leak_bounded_memory(
    fake: FakeVLLMServer, tmp_path: Path
) -> None:
    sink = tmp_path / "samples.jsonl"
    fake.faults.token_latency_ms = 5  # every stream stays open while the others start
    try:
        with serve_cli(fake.base_url, sink, tmp_path / "state") as (process, url):
            control = Control(url)
            for i in range(EPISODES):
                control.open(f"ep{i}")
            # warm up one call, then measure the peak RSS growth under 256 streams
            warm = httpx.post(
                f"{url}/v1/completions",
                json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2},
                timeout=30,
            )
            warm_id = f"{warm.json()['id']}/0"
            baseline = peak_rss_kib(process.pid)
            sent = asyncio.run(_streams(url))
            peak = peak_rss_kib(process.pid)
            reports = [control.close(f"ep{i}", reward=float(i)) for i in range(EPISODES)]
            control.http.close()
            assert all(r["complete"] == STREAMS_PER_EPISODE for r in reports)
            assert all(r["incomplete"] == 0 and r["unusable"] == 0 for r in reports)
        # SIGTERM: the sink is closed; every sample is on disk, each in its own episode
        by_episode: dict[str, set[str]] = {}
        for sample in samples_in(sink):
            by_episode.setdefault(str(sample["episode_id"]), set()).update(sample["call_ids"])  # type: ignore[arg-type]
        assert by_episode.pop("default") == {warm_id}  # the warm-up, outside any episode
        assert by_episode == sent
        growth_mib = (peak - baseline) / 1024
        print(f"gateway peak RSS growth under 256 streams: {growth_mib:.1f} MiB")
        # each stream is relayed chunk by chunk: growth is per-connection state, not bodies
        assert growth_mib < 0.5 * EPISODES * STREAMS_PER_EPISODE, growth_mib
    finally:
        fake.faults.token_latency_ms = 0


async def _streams(url: str) -> dict[str, set[str]]:
    """Each episode's streams through its own base URL; the call ids each episode was sent."""
    sent: dict[str, set[str]] = {f"ep{i}": set() for i in range(EPISODES)}

    async def one(client: openai.AsyncOpenAI, episode: str, k: int) -> None:
        stream = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": f"{episode} stream {k}"}],
            max_tokens=40,
            stream=True,
        )
        text, rid = "", ""
        async for chunk in stream:
            rid = chunk.id
            text += "".join(c.delta.content or "" for c in chunk.choices)
        assert episode in text  # the answer to this episode's own request
        sent[episode].add(f"{rid}/0")

    clients = [
        openai.AsyncOpenAI(base_url=f"{url}/episodes/ep{i}/v1", api_key="k", max_retries=0)
        for i in range(EPISODES)
    ]
    try:
        await asyncio.gather(
            *(
                one(clients[i], f"ep{i}", k)
                for k in range(STREAMS_PER_EPISODE)
                for i in range(EPISODES)
            )
        )
    finally:
        for client in clients:
            await client.close()
    return sent


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_restart_reports_open_episodes_lost_and_writes_nothing_of_them(
    fake: FakeVLLMServer, tmp_path: Path, how: signal.Signals
) -> None:
    sink, state = tmp_path / "samples.jsonl", tmp_path / "state"
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
    with serve_cli(fake.base_url, sink, state) as (process, url):
        control = Control(url)
        control.open("done")
        control.open("open-at-stop")
        for episode in ("done", "open-at-stop"):
            response = httpx.post(f"{url}/episodes/{episode}/v1/chat/completions", json=body)
            assert response.status_code == 200
        assert control.close("done")["samples"] == 1
        if how is signal.SIGKILL:  # a crash: wait until the closed episode is on disk
            for _ in range(100):
                if samples_in(sink):
                    break
                time.sleep(0.05)
        process.send_signal(how)
        _, stderr = process.communicate(timeout=30)
        control.http.close()
    if how is signal.SIGTERM:
        assert b"stopping with 1 episodes open" in stderr
    assert [s["episode_id"] for s in samples_in(sink)] == ["done"]
    with serve_cli(fake.base_url, sink, state) as (process, url):
        control = Control(url)
        report = control.report("open-at-stop").json()
        assert report["status"] == "lost"
        assert control.http.get("/control/episodes").json()["lost"] == ["open-at-stop"]
        response = httpx.post(f"{url}/episodes/open-at-stop/v1/chat/completions", json=body)
        assert response.status_code == 409
        assert "restarted" in response.json()["error"]["message"]
        assert control.close("open-at-stop")["status"] == "lost"  # acknowledged
        assert control.http.get("/control/episodes").json()["lost"] == []
        control.http.close()
    assert [s["episode_id"] for s in samples_in(sink)] == ["done"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_streams_through_the_gateway(fake: FakeVLLMServer, tmp_path: Path) -> None:
    sink = tmp_path / "samples.jsonl"
    with serve_cli(fake.base_url, sink, tmp_path / "state") as (_, url):
        control = Control(url)
        control.open("curl-ep")
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "curl"}],
            "max_tokens": 12,
            "stream": True,
        }
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "-N",
                "-H",
                "content-type: application/json",
                "-d",
                json.dumps(body),
                f"{url}/episodes/curl-ep/v1/chat/completions",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        events = [line[6:] for line in out.splitlines() if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        streamed = [
            t
            for e in events[:-1]
            for c in json.loads(e)["choices"]
            for t in c.get("token_ids") or []
        ]
        report = control.close("curl-ep")
        control.http.close()
        assert (report["complete"], report["samples"]) == (1, 1)
    (sample,) = samples_in(sink)
    assert sample["token_ids"][-len(streamed) :] == streamed  # type: ignore[index]
