"""`TitoAgentLoop` inside the real verl 0.9.1 against the real CPU vLLM: verl's `AgentLoopWorker`
picks the loop by the rows' `agent_name` from the agent-loop YAML, the loop takes the server from
verl's load balancer (its address, as verl's server ids are; Ray's actor calls done in process),
and the batch verl builds holds the ids vLLM sampled with their logprobs, the reward at each row's
last token, and the global steps.

Runs in `.venv-verl` (`make test-verl`); skips where verl is not installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

agent_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed here (make test-verl runs this in .venv-verl)",
)
torch = pytest.importorskip("torch", reason="verl needs torch")

from tests.support.verl_loop import (  # noqa: E402
    model_dir,
    rollout_servers,
    trainer_config,
)
from tito_agents.testing.smollm2 import load_tokenizer  # noqa: E402


async def test_verls_worker_runs_the_agent_against_real_vllm(
    tmp_path: Path, vllm_base_url: str
) -> None:
    yaml = tmp_path / "agent_loops.yaml"
    yaml.write_text(
        "- name: short\n"
        "  _target_: tito_agents.rl.verl_loop.TitoAgentLoop\n"
        "  agent: tests.support.verl_loop:short_agent\n"
    )
    config = trainer_config(model_dir(tmp_path), yaml)
    llm_client, balancer = rollout_servers(vllm_base_url)
    worker = agent_loop.AgentLoopWorker(config, llm_client=llm_client)
    from verl.protocol import DataProto

    prompt = [{"role": "user", "content": "Name a colour."}]
    n = 2
    batch = DataProto.from_dict(
        tensors={"dummy": torch.zeros(n, 1)},
        non_tensors={
            "raw_prompt": np.array([prompt] * n, dtype=object),
            "agent_name": np.array(["short"] * n, dtype=object),
            "uid": np.array(["g"] * n, dtype=object),
            "global_steps": np.array([4] * n, dtype=object),
        },
    )
    data = await worker.generate_sequences(batch)

    # each episode took the server from verl's balancer and gave it back
    assert len(balancer._request_id_to_server) == n
    assert list(balancer._inflight_requests.values()) == [0]
    assert data.non_tensor_batch["tito_failure"].tolist() == [None] * n
    assert data.batch["rm_scores"].sum(dim=1).tolist() == [1.0] * n
    response_length = config.actor_rollout_ref.rollout.response_length
    mask = data.batch["response_mask"]
    attention = data.batch["attention_mask"][:, -response_length:]
    logprobs = data.batch["rollout_log_probs"]
    tokenizer = load_tokenizer()
    for row in range(n):
        sampled = int(mask[row].sum())
        assert 1 <= sampled <= 8 and int(attention[row].sum()) >= sampled
        assert (logprobs[row][mask[row] == 1] <= 0).all()
        prompt_ids = data.batch["prompts"][row][
            data.batch["attention_mask"][row, :-response_length] == 1
        ]
        assert "Name a colour." in tokenizer.decode(prompt_ids.tolist())
    steps = data.non_tensor_batch
    assert np.array(steps["min_global_steps"], dtype=int).tolist() == [4] * n
    assert np.array(steps["max_global_steps"], dtype=int).tolist() == [4] * n
