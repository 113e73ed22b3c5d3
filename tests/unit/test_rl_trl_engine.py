"""`tito_agents.rl.trl_engine` inside TRL 1.16's real `GRPOTrainer`: with `attach_engine` the
trainer computes its importance ratio against the rollout logprobs (its sampling metrics appear),
pushes the weights into the (played) dev-mode server once per step after the first, and the next
rows carry the engine's version; `RatioProbe` records the log ratio of every batch. Also the
async mode (`TrlRollout(lag=1)`): rows of the previous call's prompts, versions per call."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

import tito_agents as tito
from tests.support.sessions_fake import responder
from tests.support.vllm_dev_routes import DevRoutes
from tito_agents.rl import TrlRollout, VersionLog
from tito_agents.rl.trl_engine import EngineSync, RatioProbe, attach_engine, batch_ratio
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

torch = pytest.importorskip("torch")


@pytest.fixture
def dev() -> Iterator[DevRoutes]:
    with DevRoutes() as routes:
        routes.version = "0"
        yield routes


def rollout_on_fake(**kwargs: Any) -> TrlRollout:
    collector = tito.Collector(capture_logprobs=True, assembly="merged", policy_version="0")
    client = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(
                transport=mock_transport(FakeVLLM(FakeConfig(responder=responder)))
            ),
        )
    )

    async def agent(prompt: Any, client: Any) -> float:
        await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": str(prompt)}], max_tokens=8
        )
        return 1.0 if "0" in str(prompt) else 0.0

    return TrlRollout(agent, collector, client, **kwargs)


@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
def test_attached_trainer_uses_rollout_logprobs_and_syncs_each_step(
    dev: DevRoutes, tmp_path: Path
) -> None:
    from tests.support.trl_trainer import grpo_trainer

    versions = VersionLog(initial="0")
    rollout = rollout_on_fake(versions=versions)
    trainer = grpo_trainer(load_tokenizer(), tmp_path, rollout)
    trainer.args.max_steps = 2
    engine = attach_engine(
        trainer, dev.url, tmp_path / "weights", collector=rollout.collector, versions=versions
    )
    probe = RatioProbe(trainer)
    seen: list[list[str | None]] = []
    inner = rollout.run

    def recording(prompts: Any, n: int) -> Any:
        out = inner(prompts, n)
        seen.append(rollout.last_timings.policy_versions)
        return out

    rollout.run = recording  # type: ignore[method-assign]
    trainer.train()
    rollout.close()
    rollout.collector.close()

    assert trainer.use_vllm and isinstance(trainer.vllm_generation, EngineSync)
    # one push, before the second batch: version "1", the collector follows
    assert [u.version for u in engine.updates] == ["1"] and dev.version == "1"
    assert dev.reloads() == [str((tmp_path / "weights").resolve())]
    assert (tmp_path / "weights" / "model.safetensors").is_file()
    assert rollout.collector.settings.policy_version == "1"
    assert seen == [["0", "0"], ["1", "1"]]
    assert [u.version for u in versions.updates] == ["1"]
    # TRL took the rollout logprobs: its importance-sampling metrics are there
    logged = trainer.state.log_history[0]
    assert "sampling/sampling_logp_difference/mean" in logged
    assert len(probe.batches) == 2 and all(b.tokens > 0 for b in probe.batches)
    assert probe.batches[0].mean_abs == pytest.approx(
        logged["sampling/sampling_logp_difference/mean"], rel=1e-4
    )
    with pytest.raises(RuntimeError, match="generates nothing"):
        engine.generate()


def test_attach_engine_refuses_a_trainer_it_cannot_drive() -> None:
    class Plain:
        rollout_func = None

    with pytest.raises(ValueError, match="rollout_func"):
        attach_engine(Plain(), "http://x/v1", "w")

    class OwnVllm:
        rollout_func = object()
        use_vllm = True
        vllm_generation = object()

    with pytest.raises(ValueError, match="drives a vLLM of its own"):
        attach_engine(OwnVllm(), "http://x/v1", "w")


def test_batch_ratio_masks_env_tokens_and_missing_logprobs() -> None:
    nan = math.nan
    output = {
        "old_per_token_logps": torch.tensor([[-1.0, -2.0, -3.0, -4.0]]),
        "sampling_per_token_logps": torch.tensor([[-1.0, -2.5, nan, -1.0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1]]),
        "tool_mask": torch.tensor([[1, 1, 1, 0]]),
    }
    ratio = batch_ratio(output)
    assert ratio.tokens == 2 and ratio.outside_clip == 1
    assert ratio.mean_abs == pytest.approx(0.25) and ratio.max_abs == pytest.approx(0.5)
    assert ratio.frac_outside_clip == 0.5
    assert ratio.rows == 1 and math.isnan(ratio.weight_mean)
    output["importance_sampling_ratio"] = torch.tensor([[0.2], [1.0]])
    output = {
        k: torch.cat([v, v]) if k != "importance_sampling_ratio" else v for k, v in output.items()
    }
    weighted = batch_ratio(output)
    assert (weighted.rows, weighted.rows_downweighted) == (2, 1)
    assert weighted.weight_mean == pytest.approx(0.6)
    assert math.isnan(batch_ratio({}).mean_abs)


def test_lag_one_returns_the_previous_calls_rollouts() -> None:
    """Async mode: call k returns the episodes of call k-1's prompts, sampled while step k-1
    trained; the first call fills the pipeline with its own prompts."""
    rollout = rollout_on_fake(lag=1)
    with rollout:
        first = rollout.run(["p0", "p0"], 2)
        second = rollout.run(["p1", "p1"], 2)
        third = rollout.run(["p2", "p2"], 2)
    assert first["reward"] == [1.0, 1.0]
    assert second["reward"] == [1.0, 1.0]  # p0 again, sampled in the background
    assert third["reward"] == [0.0, 0.0]  # p1
    assert rollout.last_timings.episodes == 2
    rollout.run(["p3", "p3"], 2)  # a new loop after close; close(client=True) closes the client
    rollout.close(client=True)
    rollout.collector.close()
    assert rollout.client.is_closed()
    with pytest.raises(ValueError, match="lag"):
        rollout_on_fake(lag=2)
