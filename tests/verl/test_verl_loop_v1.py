"""`TitoAgentLoop` under verl's v1 trainer's worker (`AgentLoopWorkerTQ`): its `_run_prompt` runs
`rollout.n` sessions of a prompt, each through our loop, and puts every row into TransferQueue
with the tags the v1 trainer casts to int (`min_global_steps` / `max_global_steps`). TransferQueue's
storage needs its Ray controller, so its two puts are recorded here instead; everything between
the prompt and those puts is verl's own code.

Runs in `.venv-verl` (`make test-verl`); skips where verl or TransferQueue is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

agent_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed here (make test-verl runs these in .venv-verl)",
)
pytest.importorskip(
    "transfer_queue", reason="TransferQueue (verl's v1 data plane) is not installed"
)
tq_worker = pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq")
torch = pytest.importorskip("torch", reason="verl needs torch")

from tests.support.sessions_fake import responder  # noqa: E402
from tests.support.verl_loop import model_dir, rollout_servers, trainer_config  # noqa: E402
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer  # noqa: E402


def v1_worker(tmp_path: Path, base_url: str, agent: str, n: int) -> Any:
    """verl's `AgentLoopWorkerTQ` (the class under its `ray.remote`), initialised as verl does
    but for `tq.init()` (TransferQueue's Ray controller)."""
    yaml = tmp_path / "agent_loops.yaml"
    yaml.write_text(
        f"- name: tito\n  _target_: tito_agents.rl.verl_loop.TitoAgentLoop\n  agent: {agent}\n"
    )
    config = trainer_config(model_dir(tmp_path), yaml)
    config.actor_rollout_ref.rollout.n = n
    cls = tq_worker.AgentLoopWorkerTQ.__ray_actor_class__
    worker = object.__new__(cls)
    agent_loop.AgentLoopWorker.__init__(worker, config, llm_client=rollout_servers(base_url)[0])
    worker.background_tasks = set()
    return worker


@pytest.fixture
def puts(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """TransferQueue's puts, recorded: `kv` (status tags), `batch` (rows: keys, fields, tags)."""
    seen: dict[str, list[Any]] = {"kv": [], "batch": []}

    async def kv_put(**kwargs: Any) -> None:
        seen["kv"].append(kwargs["tag"]["status"])

    async def kv_batch_put(**kwargs: Any) -> None:
        seen["batch"].append(kwargs)

    monkeypatch.setattr(tq_worker.tq, "async_kv_put", kv_put)
    monkeypatch.setattr(tq_worker.tq, "async_kv_batch_put", kv_batch_put)
    return seen


async def run_prompt(worker: Any, global_steps: int) -> None:
    prompt = {
        "uid": "p0",
        "raw_prompt": [{"role": "user", "content": "Weather in Paris?"}],
        "agent_name": "tito",
        "global_steps": torch.tensor(global_steps),
        "index": 0,
    }
    trajectory = {"step": global_steps, "sample_index": 0, "rollout_n": 0, "validate": False}
    await worker._run_prompt(prompt, {"temperature": 1.0}, trajectory)


async def test_v1_worker_puts_our_rows_with_int_global_step_tags(
    tmp_path: Path, puts: dict[str, list[Any]]
) -> None:
    with FakeVLLMServer(FakeConfig(responder=responder)) as server:
        worker = v1_worker(tmp_path, server.base_url, "tests.support.verl_loop:weather_agent", 2)
        await run_prompt(worker, global_steps=6)

    assert puts["kv"] == ["running", "finished"]
    assert len(puts["batch"]) == 2  # one put per session, one row each
    tags = [tag for put in puts["batch"] for tag in put["tags"]]
    # what the v1 trainer does with them (trainer_base.py): an unset one is a TypeError there
    assert np.array([t["min_global_steps"] for t in tags], dtype=int).tolist() == [6, 6]
    assert np.array([t["max_global_steps"] for t in tags], dtype=int).tolist() == [6, 6]
    assert all(t["status"] == "success" and t["response_len"] > 0 for t in tags)
    assert [put["keys"] for put in puts["batch"]] in (
        [["p0_0_0"], ["p0_1_0"]],
        [["p0_1_0"], ["p0_0_0"]],
    )


async def test_v1_worker_puts_one_row_per_linked_segment(
    tmp_path: Path, puts: dict[str, list[Any]]
) -> None:
    """An episode of two segments: v1 takes the list, one row (key `{uid}_{session}_{i}`) each,
    both with the episode's reward."""
    with FakeVLLMServer(FakeConfig(responder=responder)) as server:
        worker = v1_worker(
            tmp_path, server.base_url, "tests.support.verl_loop:two_conversations", 1
        )
        await run_prompt(worker, global_steps=1)

    assert puts["kv"] == ["running", "finished"]
    (put,) = puts["batch"]
    assert put["keys"] == ["p0_0_0", "p0_0_1"]
    # verl's `rm_scores`: the reward on each row's last response token
    rewards = [float(row.sum()) for row in put["fields"]["rm_scores"].unbind(0)]
    assert rewards == [0.75, 0.75]
    assert [t["min_global_steps"] for t in put["tags"]] == [1, 1]
