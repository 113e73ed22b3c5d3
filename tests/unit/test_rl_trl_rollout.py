"""`tito_agents.rl.TrlRollout` against the fake vLLM: one merged row per episode, tool turns
masked out of the completion, the agent's reward forwarded, split episodes refused with the fix,
and the whole thing inside TRL 1.16's real `GRPOTrainer` step."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import tito_agents as tito
from tests.support.sessions_fake import responder
from tests.support.weather import OBSERVATION, WEATHER_TOOLS, tool_results, weather_answer
from tito_agents.convert import prompt_length
from tito_agents.errors import ConfigurationError
from tito_agents.rl import EpisodeSplitError, TrlRollout, passthrough_reward
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer


async def tool_agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
    """Calls the weather tool, reads its result, answers; reward 1 when the answer is sunny."""
    messages: Any = [{"role": "user", "content": str(prompt)}]
    answer = await weather_answer(client, MODEL_NAME, messages)
    return 1.0 if "sunny" in answer else 0.0


def make_rollout(
    fake: FakeVLLM, agent: Any = tool_agent, *, sessions: bool = False, **collector_kw: Any
) -> TrlRollout:
    settings: dict[str, Any] = {"capture_logprobs": True, "assembly": "merged", **collector_kw}
    collector = tito.Collector(**settings)
    client = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=mock_transport(fake)),
        ),
        sessions=sessions,
    )
    return TrlRollout(agent, collector, client)


@pytest.fixture(scope="module")
def fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=responder))


@pytest.fixture(scope="module")
def drift_fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=responder, tokenization="drift", drift_rate=0.5))


def test_multi_turn_tool_episodes_are_one_row_each(fake: FakeVLLM) -> None:
    """Two prompts x two generations: four episodes, each one merged row whose completion holds
    both model turns with the tool result between them at env_mask 0."""
    prompts = ["Weather in Paris?"] * 2 + ["Weather in Rome?"] * 2
    with make_rollout(fake) as rollout:
        out = rollout.run(prompts, num_generations=2)
        samples = rollout.last_samples
        timings = rollout.last_timings
    rollout.collector.close()

    assert sorted(out) == ["completion_ids", "env_mask", "logprobs", "prompt_ids", "reward"]
    assert len(samples) == 4 and all(len(out[k]) == 4 for k in out)
    assert out["reward"] == [1.0] * 4
    assert passthrough_reward(prompts, out["completion_ids"], out["reward"]) == [1.0] * 4
    tokenizer = load_tokenizer()
    for row, sample in enumerate(samples):
        assert sample.view == "merged" and len(sample.spans) == 2
        split = prompt_length(sample)
        assert out["prompt_ids"][row] + out["completion_ids"][row] == sample.token_ids.tolist()
        mask = np.asarray(out["env_mask"][row])
        assert mask.tolist() == sample.loss_mask[split:].tolist()
        # model turn, then the tool turn (0), then the model again
        assert mask[0] == 1 and mask[-1] == 1 and (mask == 0).any()
        context = np.asarray(out["completion_ids"][row])[mask == 0]
        assert OBSERVATION in tokenizer.decode(context.tolist())
        ratio = sample.ratio_logprobs()
        assert ratio is not None
        assert out["logprobs"][row] == pytest.approx(ratio[split:].tolist())
        assert all(lp < 0 for lp, m in zip(out["logprobs"][row], mask, strict=True) if m)
    groups = [s.group_id for s in samples]
    assert groups[0] == groups[1] != groups[2] == groups[3]
    assert len({s.episode_id for s in samples}) == 4
    assert timings.episodes == 4 and timings.rollout_s > 0 and timings.convert_s >= 0


def test_episodes_of_a_batch_run_concurrently(fake: FakeVLLM) -> None:
    in_flight = peak = 0

    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        in_flight -= 1
        return 0.5

    with make_rollout(fake, agent) as rollout:
        out = rollout.run(["a"] * 3 + ["b"] * 3, num_generations=3)
        rollout.max_concurrency = 2
        rollout.run(["a"] * 3 + ["b"] * 3, num_generations=3)
    assert out["reward"] == [0.5] * 6
    assert peak == 6  # the first call: every episode at once
    # the trainer's own loop may be running: the rollout runs on its own
    assert asyncio.run(asyncio.to_thread(rollout.run, ["c", "c"], 2))["reward"] == [0.5, 0.5]
    rollout.close()


def test_split_episode_is_refused_with_the_reason_and_the_fix(drift_fake: FakeVLLM) -> None:
    """Without sessions the server re-tokenizes the sampled text: the second turn does not extend
    the first, the episode splits in two merged samples, and TRL cannot take both."""
    rollout = make_rollout(drift_fake, tokenizer=load_tokenizer())  # the kind gets named
    with rollout, pytest.raises(EpisodeSplitError) as caught:
        rollout.run(["Weather in Paris?"], num_generations=1)
    message = str(caught.value)
    assert "2 merged samples" in message and "retokenized" in message
    assert "sessions=True" in message
    assert any("prompt entry 0" in note for note in caught.value.__notes__)

    with make_rollout(drift_fake, sessions=True) as rollout:
        out = rollout.run(["Weather in Paris?"], num_generations=1)
    assert len(rollout.last_samples[0].spans) == 2 and out["reward"] == [1.0]


def test_a_session_fallback_is_named_in_the_refusal(fake: FakeVLLM) -> None:
    """Sessions on, but the agent drops the tools on its second call: the history is no longer
    append-only, the server renders it, the episode splits; the refusal says so."""

    async def forgetful(prompt: Any, client: openai.AsyncOpenAI) -> float:
        messages: Any = [{"role": "user", "content": str(prompt)}]
        first = await client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=WEATHER_TOOLS, max_tokens=64
        )
        messages.extend(tool_results(first.choices[0].message))
        await client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16)
        return 1.0

    rollout = make_rollout(fake, forgetful, sessions=True)
    with rollout, pytest.raises(EpisodeSplitError) as caught:
        rollout.run(["Weather in Paris?"], num_generations=1)
    message = str(caught.value)
    assert "sessions fell back" in message and "changed tools" in message
    assert "the same tools on every call" in message


def test_a_policy_switch_mid_episode_is_named_in_the_refusal(fake: FakeVLLM) -> None:
    """The agent's second call goes to another policy (a hook that answers by call count): the
    merged sample splits there (one policy per sample) and the refusal says how to avoid it."""
    seen: list[str | None] = []

    def hook(agent: str | None, labels: Any) -> str | None:
        seen.append(agent)
        return None if len(seen) == 1 else MODEL_NAME

    rollout = make_rollout(fake, policies=hook)
    with rollout, pytest.raises(EpisodeSplitError) as caught:
        rollout.run(["Weather in Paris?"], num_generations=1)
    message = str(caught.value)
    assert "policy_switch" in message and "one policy for a whole episode" in message


def test_misconfigured_collector_or_prompts_are_refused(fake: FakeVLLM) -> None:
    with pytest.raises(ConfigurationError, match="assembly='merged'"):
        make_rollout(fake, assembly="per_call")
    with pytest.raises(ConfigurationError, match="capture_logprobs=True"):
        make_rollout(fake, capture_logprobs=False)
    with make_rollout(fake) as rollout:
        with pytest.raises(ValueError, match="whole blocks"):
            rollout.run(["a", "a", "b"], num_generations=2)
        with pytest.raises(ValueError, match="differ"):
            rollout.run(["a", "b"], num_generations=2)


def test_agent_failure_names_the_prompt_entry(fake: FakeVLLM) -> None:
    async def broken(prompt: Any, client: openai.AsyncOpenAI) -> float:
        if prompt == "bad":
            raise RuntimeError("tool crashed")
        return await tool_agent(prompt, client)

    rollout = make_rollout(fake, broken)
    with rollout, pytest.raises(RuntimeError, match="tool crashed") as caught:
        rollout.run(["ok", "ok", "bad", "bad"], num_generations=2)
    assert any("prompt entry 2" in note for note in caught.value.__notes__)


@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
def test_grpo_trainer_steps_on_trl_rollout(fake: FakeVLLM, tmp_path: Path) -> None:
    """TRL 1.16's GRPOTrainer calls the rollout as its rollout_func and trains one step on the
    tool episodes: completion lengths count the model's tokens only (env_mask), the reward is the
    agent's."""
    pytest.importorskip("trl", reason="trl is not installed (pip install trl)")
    from tests.support.trl_trainer import grpo_trainer

    rollout = make_rollout(fake)
    trainer = grpo_trainer(load_tokenizer(), tmp_path, rollout)
    result = trainer.train()
    rollout.close()
    rollout.collector.close()

    assert result.global_step == 1
    samples = rollout.last_samples
    assert len(samples) == 2 and all(len(s.spans) == 2 for s in samples)
    logged = trainer.state.log_history[0]
    assert logged["completions/mean_length"] == pytest.approx(
        np.mean([s.num_trained for s in samples])
    )
    assert logged["reward"] == pytest.approx(1.0)
