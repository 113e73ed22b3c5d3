"""`tito_agents.rl.skyrl_generator.TitoGenerator` inside the real skyrl 0.4.0, against the fake
vLLM over HTTP: a `GeneratorInterface` whose `GeneratorOutput` passes SkyRL's own check of what a
generator returns (`validate_generator_output`, step-wise too) and SkyRL's own tensorisation
(`convert_prompts_responses_to_batch_tensors`), linked segments as steps that SkyRL's trainer
code trains with their trajectory's advantage, and every bad input turned into a row SkyRL's loop
takes.

skyrl is not a dependency of the project and needs Python >= 3.12: `make test-skyrl` runs these in
`.venv-skyrl`, where it is installed; elsewhere they skip, saying so.
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest

base = pytest.importorskip(
    "skyrl.train.generators.base",
    reason="skyrl is not installed here (make test-skyrl runs these in .venv-skyrl)",
)
trainer_utils = pytest.importorskip("skyrl.train.utils.trainer_utils", reason="skyrl is missing")
preprocess = pytest.importorskip("skyrl.train.dataset.preprocess", reason="skyrl is missing")
trainer = pytest.importorskip("skyrl.train.trainer", reason="skyrl is missing")
config = pytest.importorskip("skyrl.train.config", reason="skyrl is missing")
torch = pytest.importorskip("torch", reason="skyrl needs torch")

from tests.support.sessions_fake import responder  # noqa: E402
from tito_agents.rl import skyrl_generator  # noqa: E402
from tito_agents.rl.skyrl_generator import (  # noqa: E402
    FAILURES,
    SUPPORTED_SKYRL,
    TitoGenerator,
    check_skyrl_version,
)
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer  # noqa: E402
from tito_agents.testing.smollm2 import load_tokenizer  # noqa: E402

TrajectoryID = base.TrajectoryID
OBSERVATION = "18C, sunny"
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


# ---- agents: `async def agent(prompt, client, **fields) -> reward` ----


async def weather_agent(prompt: Any, client: Any, model: str, reward_spec: Any = None) -> float:
    """A plain openai tool agent: calls the weather tool, reads the result, answers; reward 1 when
    the answer holds the prompt's ground truth (SkyRL's `env_extras["reward_spec"]`)."""
    messages: Any = list(prompt)
    answer = ""
    for _ in range(3):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=WEATHER_TOOLS, max_tokens=64
        )
        message = response.choices[0].message
        messages.append(
            message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        )
        if not message.tool_calls:
            answer = message.content or ""
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": OBSERVATION})
    truth = (reward_spec or {}).get("ground_truth", "sunny")
    return 1.0 if truth in answer else 0.0


async def two_conversations(prompt: Any, client: Any, model: str) -> float:
    """Two calls whose histories do not chain: one episode of two linked segments."""
    for text in ("First question?", "An unrelated second question?"):
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=8
        )
    return 0.75


async def short_agent(prompt: Any, client: Any, model: str) -> float:
    """One short call; reward 1 whatever it says."""
    await client.chat.completions.create(model=model, messages=list(prompt), max_tokens=8)
    return 1.0


def returning(reward: Any) -> Any:
    async def agent(prompt: Any, client: Any, model: str) -> Any:
        await client.chat.completions.create(model=model, messages=list(prompt), max_tokens=4)
        return reward

    return agent


async def raising(prompt: Any, client: Any) -> float:
    raise RuntimeError("the tool broke")


async def silent(prompt: Any, client: Any) -> float:
    return 1.0


# ---- SkyRL's side ----


@pytest.fixture(scope="module")
def server() -> Any:
    with FakeVLLMServer(FakeConfig(responder=responder)) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer()


class EngineClient(SimpleNamespace):
    """The two members of SkyRL's `InferenceEngineInterface` a generator reads: the router's
    root URL (`RemoteInferenceClient.get_endpoint_url` returns its `proxy_url`, no /v1) and
    the served model's name."""

    def get_endpoint_url(self) -> str:
        return str(self.url)


def served_model_name(server: Any) -> str:
    return str(httpx.get(f"{server.base_url}/models").json()["data"][0]["id"])


@pytest.fixture
def engine(server: Any) -> EngineClient:
    return EngineClient(
        url=server.base_url.removesuffix("/v1"), model_name=served_model_name(server)
    )


def batch(*prompts: Any, extras: list[dict[str, Any]] | None = None, repeat: int = 1) -> Any:
    """A `GeneratorInput` as SkyRL's trainer builds it: each prompt `repeat` times in a group."""
    rows = [(i, r, p) for i, p in enumerate(prompts) for r in range(repeat)]
    return base.GeneratorInput(
        prompts=[p for _, _, p in rows],
        env_classes=["tito"] * len(rows),
        env_extras=[(extras or [{}] * len(prompts))[i] for i, _, _ in rows],
        sampling_params=None,
        trajectory_ids=[TrajectoryID(instance_id=f"task{i}", repetition_id=r) for i, r, _ in rows],
        batch_metadata=base.BatchMetadata(global_step=3, training_phase="train"),
    )


def validate(output: Any, num_prompts: int, *, step_wise: bool = False) -> None:
    """SkyRL's own check of a generator's output (the trainer runs it on every batch)."""
    trainer_utils.validate_generator_output(num_prompts, output, step_wise=step_wise)


def tensorise(output: Any, pad_id: int) -> Any:
    """SkyRL's own tensorisation of a batch: per-token rewards on each row's last token, as its
    trainer's `postprocess_generator_output` makes them, then one left-padded block per row."""
    rewards = []
    for reward, response in zip(output["rewards"], output["response_ids"], strict=True):
        per_token = [0.0] * len(response)
        per_token[-1] = float(reward)
        rewards.append(per_token)
    return preprocess.convert_prompts_responses_to_batch_tensors(
        pad_id,
        output["prompt_token_ids"],
        output["response_ids"],
        rewards,
        output["loss_masks"],
        output["rollout_logprobs"],
    )


def trainer_advantages(output: Any, tokenizer: Any, *, step_wise: bool, group_size: int) -> Any:
    """The advantages SkyRL's trainer computes for a batch, by its own code: `RayPPOTrainer`'s
    `postprocess_generator_output`, `convert_to_training_input` and
    `compute_advantages_and_returns` (GRPO), called with a stand-in for the trainer object that
    holds what they read (its config, tokenizer, metrics and data-parallel size), since the real
    one needs Ray workers and GPUs. Returns the advantages and loss mask, `[rows, response]`."""
    cfg = config.SkyRLTrainConfig()
    cfg.generator.step_wise_trajectories = step_wise
    cfg.generator.n_samples_per_prompt = group_size
    cfg.trainer.algorithm.advantage_estimator = "grpo"
    cfg.trainer.train_batch_size = cfg.trainer.policy_mini_batch_size = 1
    stand_in = SimpleNamespace(
        cfg=cfg,
        tokenizer=tokenizer,
        all_metrics={},
        dispatch=SimpleNamespace(get_lcm_dp_size=lambda: 1),
    )
    ppo = trainer.RayPPOTrainer
    uids = [t.instance_id for t in output["trajectory_ids"]]
    output, uids = ppo.postprocess_generator_output(stand_in, output, uids)
    data = ppo.convert_to_training_input(stand_in, output, uids)
    data["values"] = None
    data = ppo.compute_advantages_and_returns(stand_in, data)
    return data["advantages"], data["loss_mask"]


# ---- the tests ----


def test_it_is_skyrls_generator_interface_and_other_releases_are_refused() -> None:
    assert issubclass(TitoGenerator, base.GeneratorInterface)
    check_skyrl_version(SUPPORTED_SKYRL[-1])
    with pytest.raises(ImportError, match=r"pip install 'skyrl==0\.4\.0'"):
        check_skyrl_version("0.3.0")


async def test_a_tool_episode_per_prompt_passes_skyrls_checks_and_tensorisation(
    engine: EngineClient, tokenizer: Any
) -> None:
    """Two prompts, two repetitions each, a plain openai tool agent on SkyRL's endpoint: one row
    per trajectory holding both model turns, the tool result between them at mask 0, the sampled
    tokens' logprobs, the reward from the prompt's `reward_spec`; SkyRL's checks and its
    tensorisation take the batch."""
    generator = TitoGenerator(
        weather_agent, tokenizer=tokenizer, inference_engine_client=engine, max_concurrency=2
    )
    extras = [{"reward_spec": {"ground_truth": "sunny"}}, {"reward_spec": {"ground_truth": "x"}}]
    inputs = batch(PROMPT, [{"role": "user", "content": "And in Rome?"}], extras=extras, repeat=2)
    out = await generator.generate(inputs)

    validate(out, 4)
    assert out["trajectory_ids"] == inputs["trajectory_ids"]
    assert out["rewards"] == [1.0, 1.0, 0.0, 0.0]
    assert out["is_last_step"] is None and out["rollout_sample_support"] is None
    assert out["rollout_metrics"] == {"tito/failed_trajectories": 0}
    for response, mask, logprobs in zip(
        out["response_ids"],
        out["loss_masks"],
        out["rollout_logprobs"],
        strict=True,
    ):
        mask_a, logprobs_a = np.asarray(mask), np.asarray(logprobs)
        assert mask_a[0] == 1 and mask_a[-1] == 1 and (mask_a == 0).any()
        assert OBSERVATION in tokenizer.decode(np.asarray(response)[mask_a == 0].tolist())
        assert (logprobs_a[mask_a == 1] < 0).all() and (logprobs_a[mask_a == 0] == 0).all()
    assert "Weather in Paris?" in tokenizer.decode(out["prompt_token_ids"][0])
    assert "And in Rome?" in tokenizer.decode(out["prompt_token_ids"][2])

    sequences, _, _, rewards, loss_mask, logprobs, *_ = tensorise(out, tokenizer.pad_token_id or 0)
    width = max(len(r) for r in out["response_ids"])
    assert loss_mask.shape == logprobs.shape == (4, width)
    # right-aligned responses: each row's mask and logprobs end at the block's end
    for i, mask in enumerate(out["loss_masks"]):
        assert loss_mask[i, width - len(mask) :].tolist() == mask
        assert sequences[i, -len(mask) :].tolist() == out["response_ids"][i]
    assert rewards[:, -1].tolist() == [1.0, 1.0, 0.0, 0.0]


async def test_linked_segments_are_steps_of_one_trajectory(
    engine: EngineClient, tokenizer: Any
) -> None:
    """Step-wise (SkyRL's `generator.step_wise_trajectories`): an episode of two linked segments
    is two adjacent rows of one `TrajectoryID`, `is_last_step` on the second, which holds the
    reward; a one-segment episode beside it is one row. SkyRL's step-wise check takes the batch."""
    generator = TitoGenerator(
        two_conversations, tokenizer=tokenizer, inference_engine_client=engine, step_wise=True
    )
    out = await generator.generate(batch(PROMPT, repeat=2))

    validate(out, 2, step_wise=True)
    assert out["is_last_step"] == [False, True, False, True]
    assert [t.to_string() for t in out["trajectory_ids"]] == [
        "task0_0",
        "task0_0",
        "task0_1",
        "task0_1",
    ]
    assert out["rewards"] == [0.0, 0.75, 0.0, 0.75]
    assert "First question?" in tokenizer.decode(out["prompt_token_ids"][0])
    assert "An unrelated second question?" in tokenizer.decode(out["prompt_token_ids"][1])
    assert all(any(mask) for mask in out["loss_masks"])

    single = TitoGenerator(
        short_agent, tokenizer=tokenizer, inference_engine_client=engine, step_wise=True
    )
    out = await single.generate(batch(PROMPT))
    validate(out, 1, step_wise=True)
    assert out["is_last_step"] == [True]


async def test_linked_segments_without_step_wise_rows_are_refused_naming_the_fix(
    engine: EngineClient, tokenizer: Any
) -> None:
    """Without step-wise rows SkyRL takes one row per trajectory: the two-segment episode becomes
    a row that trains nothing, counted, the reason naming the fix; the batch still validates."""
    FAILURES.clear()
    generator = TitoGenerator(
        two_conversations, tokenizer=tokenizer, inference_engine_client=engine
    )
    out = await generator.generate(batch(PROMPT))
    validate(out, 1)
    assert out["loss_masks"] == [[0]] and out["rewards"] == [0.0]
    assert out["stop_reasons"] == ["error"]
    assert FAILURES == {"segments": 1}
    assert out["rollout_metrics"] == {
        "tito/failed_trajectories": 1,
        "tito/failures/segments": 1,
    }


async def test_every_bad_episode_is_a_row_that_trains_nothing(
    engine: EngineClient, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent that raises, makes no captured call, or returns a reward that is not a finite
    number (NaN, inf, a string, None without setting one): each trajectory is one row SkyRL's
    checks and tensorisation take, loss mask all 0, reward 0.0, the reason logged and counted;
    a good trajectory in the same batch is untouched."""
    agents = [
        raising,
        silent,
        returning(math.nan),
        returning(math.inf),
        returning("1.0"),
        returning(None),
        short_agent,
    ]
    FAILURES.clear()
    outputs = []
    for agent in agents:
        generator = TitoGenerator(agent, tokenizer=tokenizer, inference_engine_client=engine)
        outputs.append(await generator.generate(batch(PROMPT)))
    for out in outputs:
        validate(out, 1)
        tensorise(out, tokenizer.pad_token_id or 0)
    assert FAILURES == {"agent_error": 1, "no_call": 1, "bad_reward": 4}
    for out in outputs[:-1]:
        assert out["loss_masks"] == [[0]] and out["rewards"] == [0.0]
        assert "Weather in Paris?" in tokenizer.decode(out["prompt_token_ids"][0])
    assert outputs[-1]["rewards"] == [1.0] and any(outputs[-1]["loss_masks"][0])
    assert "RuntimeError: the tool broke" in caplog.text
    assert "no captured call" in caplog.text


async def test_a_prompt_that_is_not_chat_messages_is_a_row_that_trains_nothing(
    engine: EngineClient, tokenizer: Any
) -> None:
    """No prompt, a plain string, no messages, a list of something else: each is one row SkyRL
    takes, counted; the batch's good prompt is untouched."""
    FAILURES.clear()
    generator = TitoGenerator(short_agent, tokenizer=tokenizer, inference_engine_client=engine)
    out = await generator.generate(batch(None, "Weather in Paris?", [], [1, 2], PROMPT))
    validate(out, 5)
    tensorise(out, tokenizer.pad_token_id or 0)
    assert FAILURES == {"no_prompt": 4}
    assert out["loss_masks"][:4] == [[0]] * 4 and out["rewards"] == [0.0] * 4 + [1.0]
    assert out["rollout_metrics"] == {
        "tito/failed_trajectories": 4,
        "tito/failures/no_prompt": 4,
    }


async def test_a_group_of_equal_rewards_gets_zero_advantage_from_skyrls_grpo(
    engine: EngineClient, tokenizer: Any
) -> None:
    """Four rollouts of one task, all reward 1.0: SkyRL's trainer gives every token advantage 0
    (nothing to learn from the group), with no NaN."""
    generator = TitoGenerator(short_agent, tokenizer=tokenizer, inference_engine_client=engine)
    out = await generator.generate(batch(PROMPT, repeat=4))
    validate(out, 4)
    advantages, _ = trainer_advantages(out, tokenizer, step_wise=False, group_size=4)
    assert torch.equal(advantages, torch.zeros_like(advantages))


async def scored_by_repetition(prompt: Any, client: Any, model: str, trajectory_id: Any) -> float:
    """Two linked segments; reward = the rollout's repetition number (0, 1, ...)."""
    await two_conversations(prompt, client, model)
    return float(trajectory_id.repetition_id)


async def test_every_step_of_a_trajectory_trains_with_the_trajectorys_advantage(
    engine: EngineClient, tokenizer: Any
) -> None:
    """Two rollouts of one task, two linked segments each, rewards 0 and 1: SkyRL's trainer
    computes the GRPO advantage from each trajectory's last step and gives it to both of its
    steps, so the first segment's tokens train too (no segment is dropped)."""
    generator = TitoGenerator(
        scored_by_repetition, tokenizer=tokenizer, inference_engine_client=engine, step_wise=True
    )
    out = await generator.generate(batch(PROMPT, repeat=2))
    validate(out, 2, step_wise=True)
    advantages, loss_mask = trainer_advantages(out, tokenizer, step_wise=True, group_size=2)
    trained = [advantages[i][loss_mask[i].bool()] for i in range(4)]
    assert all(len(row) > 0 for row in trained)
    low, high = trained[0][0].item(), trained[2][0].item()
    assert low < 0 < high and low == pytest.approx(-high)
    for row, value in zip(trained, [low, low, high, high], strict=True):
        assert torch.allclose(row, torch.full_like(row, value))


async def test_an_agent_by_name_on_a_server_of_your_own(server: Any, tokenizer: Any) -> None:
    """`agent="module:function"`, and `base_url` with `model` instead of SkyRL's engine client."""
    generator = TitoGenerator(
        "tests.skyrl.test_skyrl_generator:short_agent",
        tokenizer=tokenizer,
        base_url=server.base_url,
        model=served_model_name(server),
    )
    out = await generator.generate(batch(PROMPT))
    validate(out, 1)
    assert out["rewards"] == [1.0]


def test_one_generator_serves_successive_event_loops(engine: EngineClient, tokenizer: Any) -> None:
    """SkyRL's entrypoints each start their own event loop (`asyncio.run`): the same generator,
    its concurrency bound and the process's collector work in successive loops."""
    generator = TitoGenerator(
        short_agent, tokenizer=tokenizer, inference_engine_client=engine, max_concurrency=1
    )
    for _ in range(2):
        out = asyncio.run(generator.generate(batch(PROMPT, repeat=2)))
        validate(out, 2)
        assert out["rewards"] == [1.0, 1.0]


def test_the_server_must_be_named_once(tokenizer: Any, engine: EngineClient) -> None:
    with pytest.raises(skyrl_generator.ConfigurationError, match="needs the server"):
        TitoGenerator(short_agent, tokenizer=tokenizer)
    with pytest.raises(skyrl_generator.ConfigurationError, match="needs the server"):
        TitoGenerator(
            short_agent, tokenizer=tokenizer, inference_engine_client=engine, base_url="http://x"
        )
