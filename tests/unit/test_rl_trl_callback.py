"""Two GRPO steps of TRL 1.16's real `GRPOTrainer` on `TrlRollout` episodes (fake vLLM), with
`WeightSyncCallback` pushing each step's weights to vLLM's dev-mode routes (a stand-in server):
one reload and one new version per step, and the second batch of samples labelled with the
version the first step produced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

import openai

import tito_agents as tito
from tests.support.sessions_fake import responder
from tests.support.trl_trainer import grpo_trainer
from tests.support.vllm_dev_routes import DevRoutes
from tito_agents.rl import TrlRollout, VersionLog
from tito_agents.rl.trl_callback import WeightSyncCallback
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is deprecated and will be removed in v6:FutureWarning"
)


async def agent(prompt: object, client: openai.AsyncOpenAI) -> float:
    first = await client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": str(prompt)}], max_tokens=8
    )
    return float(len(first.choices[0].message.content or "") % 2)


def test_each_step_is_served_in_place_and_labels_the_next_samples(tmp_path: Path) -> None:
    collector = tito.Collector(capture_logprobs=True, assembly="merged", policy_version="0")
    fake = FakeVLLM(FakeConfig(responder=responder))
    client = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=mock_transport(fake)),
        )
    )
    with DevRoutes() as routes, TrlRollout(agent, collector, client) as rollout:
        trainer = grpo_trainer(load_tokenizer(), tmp_path / "trainer", rollout)
        trainer.args.max_steps = 2
        log = VersionLog(initial="default")
        sync = WeightSyncCallback(
            routes.url, tmp_path / "weights", collector=collector, versions=log
        )
        trainer.add_callback(sync)
        result = trainer.train()
    collector.close()

    assert result.global_step == 2
    assert [u.version for u in sync.updates] == ["1", "2"]
    assert [u.previous for u in sync.updates] == ["default", "1"]
    assert log.updates == sync.updates and log.current == "2"
    assert all(u.pause == "wait" and u.drained_at is not None for u in sync.updates)
    assert routes.reloads() == [str((tmp_path / "weights").resolve())] * 2
    assert (tmp_path / "weights" / "model.safetensors").is_file()
    assert collector.settings.policy_version == "2"
    versions = [[s.policy_version for s in sample.spans] for sample in captured_samples(collector)]
    assert versions == [["0"], ["0"], ["1"], ["1"]]
