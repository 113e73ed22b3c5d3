"""The capture gateway in front of the real CPU vLLM: harnesses given only a base URL (the
Python openai client, JSON and streaming; the official Node.js openai client) produce exact
samples — re-scoring them on the server reproduces the rollout logprobs (mean |Δ| within the
bf16 noise bound of tests/support/real_vllm.py on free-running calls)."""

from __future__ import annotations

import shutil

import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.gateway_harness import ServedGateway
from tests.support.real_vllm import MEAN_TOL
from tests.support.rescore_check import rescore_sample
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples

pytestmark = pytest.mark.e2e

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]


def test_python_and_node_clients_through_the_gateway_give_exact_samples(
    vllm_base_url: str, vllm_model: str
) -> None:
    collector = tito.Collector(MemorySink(), capture_logprobs=True)
    with ServedGateway(collector, vllm_base_url) as served:
        control = served.control()
        control.open("py")
        client = openai.OpenAI(
            base_url=f"{served.url}/episodes/py/v1", api_key="agent-key", max_retries=0
        )
        for stream in (False, True, False, True):
            response = client.chat.completions.create(
                model=vllm_model,
                messages=MESSAGES,
                max_tokens=24,
                temperature=1.0,
                stream=stream,
            )
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in response if c.choices)  # type: ignore[union-attr]
                assert text
        client.close()
        reports = [control.close("py", reward=1.0)]
        node_ran = shutil.which("node") is not None
        if node_ran:
            from tests.support.gateway_harness import run_node

            control.open("node")
            run_node(f"{served.url}/episodes/node/v1", vllm_model)
            reports.append(control.close("node", reward=1.0))
    collector.close()
    assert reports[0]["complete"] == 4 and reports[0]["samples"] == 4
    if node_ran:
        assert reports[1]["complete"] == 2 and reports[1]["samples"] == 2
    assert isinstance(collector.sink, MemorySink)
    samples = captured_samples(collector)
    deltas, tokens = [], 0
    for sample in samples:
        scored = rescore_sample(vllm_base_url, vllm_model, sample)
        deltas.append(scored.mean_abs * scored.tokens)
        tokens += scored.tokens
    mean = float(np.sum(deltas) / tokens)
    print(f"gateway e2e: {len(samples)} samples, {tokens} tokens re-scored, mean |Δ| {mean:.4f}")
    assert tokens > 0 and mean <= MEAN_TOL
