"""`TitoAgentLoop` under verl's `AgentLoopManager` on a local Ray cluster (CPU only): the manager
starts its `AgentLoopWorker` as a Ray actor, the worker loads our loop from the agent-loop YAML and
takes the server from verl's `GlobalRequestLoadBalancer`, itself a Ray actor, through verl's
`LLMServerClient`: all verl's own classes. The one thing not built is the `LLMServerManager`
(verl's vLLM replicas need vLLM in verl's environment and GPUs): the fake vLLM stands in for the
server it would start, registered under its `host:port` as the manager registers its replicas.

Runs in `.venv-verl` (`make test-verl`); skips where verl is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

agent_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed here (make test-verl runs these in .venv-verl)",
)
ray = pytest.importorskip("ray", reason="verl needs ray")
torch = pytest.importorskip("torch", reason="verl needs torch")

from tests.support.sessions_fake import responder  # noqa: E402
from tests.support.verl_loop import address_of, model_dir, trainer_config  # noqa: E402
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray whose workers import this checkout (the agent named in the YAML)."""
    before = {p.pid for p in psutil.Process().children()}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ours = [p for p in psutil.Process().children() if p.pid not in before]  # Ray's nodes
        ray.shutdown()
        # reaped here, so no later test sees their Popen objects warn "still running"
        for process in psutil.wait_procs(ours, timeout=60)[1]:
            process.kill()


@pytest.mark.timeout(300)
def test_verls_agent_loop_manager_runs_our_loop_on_ray(tmp_path: Path, local_ray: None) -> None:
    from verl.protocol import DataProto
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    yaml = tmp_path / "agent_loops.yaml"
    yaml.write_text(
        "- name: weather\n"
        "  _target_: tito_agents.rl.verl_loop.TitoAgentLoop\n"
        "  agent: tests.support.verl_loop:weather_agent\n"
    )
    config = trainer_config(model_dir(tmp_path), yaml)
    config.actor_rollout_ref.rollout.agent.num_workers = 1
    prompt = [{"role": "user", "content": "Weather in Paris?"}]
    n = 2
    batch = DataProto.from_dict(
        tensors={"dummy": torch.zeros(n, 1)},
        non_tensors={
            "raw_prompt": np.array([prompt] * n, dtype=object),
            "agent_name": np.array(["weather"] * n, dtype=object),
            "uid": np.array(["g0"] * n, dtype=object),
        },
        meta_info={"global_steps": 1},
    )
    with FakeVLLMServer(FakeConfig(responder=responder)) as server:
        servers: dict[str, Any] = {address_of(server.base_url): None}
        balancer = ray.remote(GlobalRequestLoadBalancer).remote(servers=servers)
        client = LLMServerClient(config=config, load_balancer_handle=balancer)
        manager = agent_loop.AgentLoopManager.create(config, llm_client=client)
        data = manager.generate_sequences(batch)
        inflight = ray.get(balancer.get_inflight_count.remote(address_of(server.base_url)))

    assert data.non_tensor_batch["tito_failure"].tolist() == [None] * n
    assert data.batch["rm_scores"].sum(dim=1).tolist() == [1.0] * n
    mask = data.batch["response_mask"]
    assert (data.batch["rollout_log_probs"][mask == 1] < 0).all()
    assert data.non_tensor_batch["__num_turns__"].tolist() == [2] * n
    assert inflight == 0  # every episode gave its server back to the balancer
