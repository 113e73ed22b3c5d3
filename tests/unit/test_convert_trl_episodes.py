"""The `rollout_func` of docs/converters.md inside TRL 1.16's real `GRPOTrainer`: episodes run
against the fake vLLM, `ep.samples` handed to `to_trl_rollout`, one training step.

The model is the tiny random Llama of tests/support/trl_trainer.py on the SmolLM2 tokenizer (the
fake vLLM samples SmolLM2 ids); the point is what TRL trains on, not what it learns.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

import openai

import tito_agents as tito
from tests.support.trl_trainer import grpo_trainer
from tito_agents.convert import to_trl_rollout
from tito_agents.samples import Sample
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import load_tokenizer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is deprecated and will be removed in v6:FutureWarning"
)

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer()


def test_grpo_trainer_steps_on_episode_samples(tokenizer: Any, tmp_path: Path) -> None:
    """A GRPOTrainer step on a rollout_func that runs one two-turn episode per prompt entry and
    returns `to_trl_rollout(ep.samples[-1] ...)`: TRL gets one merged row per entry, trains on
    exactly the sampled tokens (env_mask), and logs the episodes' rewards."""
    collector = tito.Collector(capture_logprobs=True, assembly="merged")
    http = openai.DefaultHttpxClient(transport=mock_transport(FakeVLLM(FakeConfig())))
    client = collector.wrap(
        openai.OpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
    )
    produced: list[Sample] = []

    def run_agent(prompt: str) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "The tool says 4."},
        ]
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        samples = []
        for i, prompt in enumerate(prompts):
            with collector.episode(group_id=f"g{i // trainer.num_generations}") as ep:
                run_agent(str(prompt))
                ep.set_reward(float(i % 2))
            samples.append(ep.samples[-1])
        produced.extend(samples)
        return to_trl_rollout(samples, num_generations=trainer.num_generations)

    trainer = grpo_trainer(tokenizer, tmp_path, rollout_func)
    result = trainer.train()
    collector.close()

    assert result.global_step == 1
    assert len(produced) == 2
    assert all(s.view == "merged" and len(s.spans) == 2 for s in produced)
    assert captured_samples(collector) == produced
    logged = trainer.state.log_history[0]
    assert logged["completions/mean_length"] == pytest.approx(
        np.mean([s.num_trained for s in produced])
    )
    assert logged["reward"] == pytest.approx(0.5)
