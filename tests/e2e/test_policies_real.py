"""One policy per agent on the real CPU vLLM: two LoRA adapters on SmolLM2 (made here with peft,
random non-zero A and B so that they differ clearly), served with `--enable-lora`; a two-agent
episode through `Collector(policies=...)`. Each agent's sampled ids re-score on its own adapter as
they were sampled, and not on the other one; samples carry the policy and land in a file per
policy. One extra server start (`LORA`), a few short calls.

`TITO_VLLM_LORA_URL` names a server already running with adapters `a` and `b` (left running)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.e2e_servers import ServerConfig, VllmServers, load_vllm_server_script
from tito_agents.calls import policy_of
from tito_agents.convert import group_key

ADAPTERS = ("a", "b")
POLICIES = {"planner": "a", "solver": "b"}


@pytest.fixture(scope="session")
def lora_url(vllm_servers: VllmServers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a vLLM serving the two adapters (made before the server starts)."""
    given = os.environ.get("TITO_VLLM_LORA_URL")
    if given:
        yield given
        return
    pytest.importorskip("peft")  # here, not at collection: it imports torch
    from tests.support.lora_adapters import make_adapters

    model = Path(load_vllm_server_script().served_model_dir())
    made = make_adapters(model, tmp_path_factory.mktemp("lora"), ADAPTERS)
    modules = " ".join(f"{name}={folder}" for name, folder in made.items())
    config = ServerConfig(
        extra_args=f"--enable-lora --max-loras 2 --max-lora-rank 8 --lora-modules {modules}"
    )
    yield vllm_servers.url(config)


def _rescore(url: str, model: str, prompt: list[int], sampled: list[int]) -> np.ndarray:
    """The logprob `model` gives each sampled id after the prompt (a token prompt,
    `prompt_logprobs`, as `tito_agents.rescore` asks)."""
    body = {
        "model": model,
        "prompt": prompt + sampled,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }
    answer = httpx.post(f"{url}/completions", json=body, timeout=120).json()
    rows: list[dict[str, Any]] = answer["choices"][0]["prompt_logprobs"]
    return np.array(
        [rows[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(sampled)], np.float32
    )


def test_two_agents_sample_and_rescore_on_their_own_adapters(lora_url: str, tmp_path: Path) -> None:
    out = tmp_path / "samples.jsonl"
    with tito.Collector(
        f"{out}?partition_by=policy",
        policies=POLICIES,
        policy_versions={"a": "a-1", "b": "b-7"},
        capture_logprobs=True,
    ) as collector:
        client = collector.wrap(openai.OpenAI(base_url=lora_url, api_key="EMPTY"))
        with collector.episode("ep-1", group_id="task-1") as ep:
            for agent in POLICIES:
                with tito.agent(agent):
                    reply = client.chat.completions.create(
                        model="SmolLM2-135M-Instruct",  # one name in the agent code: routed
                        messages=[{"role": "user", "content": f"You are the {agent}. Go."}],
                        max_tokens=12,
                        temperature=1.0,
                        seed=7,
                    )
                    assert reply.model == POLICIES[agent]
            ep.set_reward(1.0)
    files = {p.name for p in tmp_path.iterdir()}
    assert files == {"samples.a.jsonl", "samples.b.jsonl"}
    for policy in ADAPTERS:
        (sample,) = tito.read_samples(tmp_path / f"samples.{policy}.jsonl")
        assert policy_of(sample) == policy and sample.model == policy
        assert sample.spans[0].policy_version == f"{policy}-{'1' if policy == 'a' else '7'}"
        assert group_key(sample) == f"{policy}:task-1"
        span = sample.spans[0]
        prompt = sample.token_ids[: span.start].tolist()
        sampled = sample.token_ids[span.start : span.end].tolist()
        assert sample.logprobs is not None
        rollout = sample.logprobs[span.start : span.end]
        own = np.abs(_rescore(lora_url, policy, prompt, sampled) - rollout)
        other = ADAPTERS[1 - ADAPTERS.index(policy)]
        theirs = np.abs(_rescore(lora_url, other, prompt, sampled) - rollout)
        # bf16 prefill vs decode: ~0.1 nat on its own adapter; the other is nats away
        assert float(own.mean()) < 0.15 and float(own.max()) < 0.6, own
        assert float(theirs.mean()) > 1.0, theirs
