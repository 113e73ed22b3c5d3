"""The official openai Node.js client (npm `openai`, pinned in tests/node) through the gateway:
an agent in another language, given only a base URL, produces exact samples, streaming too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tito_agents as tito
from tests.support.gateway_harness import ServedGateway, run_node
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer


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
    samples = {s.call_ids[0]: s for s in captured_samples(collector)}
    for kind in ("json", "stream"):
        call = seen[kind]
        sample = samples[f"{call['id']}/0"]
        expected = list(call["prompt_token_ids"]) + list(call["token_ids"])  # type: ignore[call-overload]
        assert sample.token_ids.tolist() == expected, kind
        assert sample.reward == 1.0
    assert seen["stream"]["text"]
