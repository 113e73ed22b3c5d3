"""Several gateway processes feed one Redis Stream: every episode of every gateway reaches one
consumer-group reader whole (real redis-server, two `tito-agents serve` processes)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.gateway_harness import Control, serve_cli
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer

pytest.importorskip("redis", reason="redis-py not installed (pip install redis)")
if shutil.which("redis-server") is None:
    pytest.skip(
        "redis-server not installed (apt-get install redis-server)", allow_module_level=True
    )

from tests.support.redis_reading import drain
from tito_agents.sinks.harness import LocalRedisServer
from tito_agents.sinks.redis_streams import RedisStreamReader


@pytest.fixture(scope="module")
def redis_server() -> Iterator[LocalRedisServer]:
    with LocalRedisServer() as server:
        yield server


def test_two_gateways_feed_one_redis_stream(redis_server: LocalRedisServer, tmp_path: Path) -> None:
    sink = f"{redis_server.url}?stream=gateway-samples"
    expected: dict[str, int] = {}
    with FakeVLLMServer(FakeConfig()) as fake, contextlib.ExitStack() as stack:
        gateways = [
            stack.enter_context(serve_cli(fake.base_url, sink, tmp_path / f"state{g}"))[1]
            for g in range(2)
        ]
        for g, url in enumerate(gateways):
            control = Control(url)
            for e in range(3):
                episode = f"gw{g}-ep{e}"
                control.open(episode, group_id=f"gw{g}")
                for turn in range(2):
                    response = httpx.post(
                        f"{url}/episodes/{episode}/v1/chat/completions",
                        json={
                            "model": MODEL_NAME,
                            "messages": [{"role": "user", "content": f"{episode} {turn}"}],
                            "max_tokens": 6,
                            "stream": turn == 1,
                        },
                        timeout=60,
                    )
                    assert response.status_code == 200
                assert control.close(episode, reward=float(e))["samples"] == 2
                expected[episode] = 2
            control.http.close()
    # both gateways stopped (SIGTERM): their sinks delivered everything
    with RedisStreamReader(redis_server.url, stream="gateway-samples") as reader:
        got = drain(reader, 12)
    counts: dict[str, int] = {}
    for sample in got:
        counts[sample.episode_id] = counts.get(sample.episode_id, 0) + 1
        assert sample.group_id == sample.episode_id.split("-")[0]
    assert counts == expected
