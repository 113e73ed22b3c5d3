"""The official openai Node.js client (npm `openai`, pinned in tests/node) through the gateway:
an agent in another language, given only a base URL, produces exact samples, streaming too."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import tito_agents as tito
from tests.gateway import ServedGateway
from tito_agents.sinks import MemorySink
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer

NODE_DIR = Path(__file__).resolve().parents[1] / "node"


def node_client() -> Path:
    """The client script, its npm dependencies installed from the lock file on first use."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (Debian package nodejs)")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so the openai package cannot be installed")
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
            timeout=600,
        )
    return NODE_DIR / "gateway_client.mjs"


def run_node(base_url: str, model: str) -> dict[str, dict[str, object]]:
    out = subprocess.run(
        ["node", str(node_client()), base_url, model],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(tokenization="drift")) as server:
        yield server


def test_node_openai_client_json_and_stream_exact(fake: FakeVLLMServer) -> None:
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, fake.base_url) as served:
        control = served.control()
        control.open("node-ep")
        seen = run_node(f"{served.url}/episodes/node-ep/v1", MODEL_NAME)
        report = control.close("node-ep", reward=1.0)
    collector.close()
    assert (report["calls"], report["complete"], report["samples"]) == (2, 2, 2)
    assert isinstance(collector.sink, MemorySink)
    samples = {s.call_ids[0]: s for s in collector.sink.samples}
    for kind in ("json", "stream"):
        call = seen[kind]
        sample = samples[f"{call['id']}/0"]
        expected = list(call["prompt_token_ids"]) + list(call["token_ids"])  # type: ignore[call-overload]
        assert sample.token_ids.tolist() == expected, kind
        assert sample.reward == 1.0
    assert seen["stream"]["text"]
