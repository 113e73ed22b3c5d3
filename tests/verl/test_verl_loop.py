"""`tito_agents.rl.verl_loop.TitoAgentLoop` inside the real verl 0.9.1, against the fake vLLM over
HTTP: registered in verl's registry, `run()` returning verl's own `AgentLoopOutput`, verl's
`AgentLoopWorker` (built on CPU) choosing it by the dataset's `agent_name` from the agent-loop YAML
and batching its rows, and every bad input turned into what verl's loop takes.

verl is not a dependency of the project: `make test-verl` runs these in `.venv-verl`, where it is
installed; elsewhere they skip, saying so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

agent_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed here (make test-verl runs these in .venv-verl)",
)
core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")
torch = pytest.importorskip("torch", reason="verl needs torch")

from tests.support.sessions_fake import responder  # noqa: E402
from tests.support.verl_loop import (  # noqa: E402
    LocalActor,
    make_loop,
    model_dir,
    rollout_servers,
    served_model,
    trainer_config,
    two_conversations,
)
from tests.support.weather import OBSERVATION  # noqa: E402
from tito_agents.rl import verl_loop  # noqa: E402
from tito_agents.rl.verl_loop import (  # noqa: E402
    FAILURES,
    SUPPORTED_VERL,
    TitoAgentLoop,
    check_verl_version,
)
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer  # noqa: E402
from tito_agents.testing.smollm2 import load_tokenizer  # noqa: E402

PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server() -> Any:
    with FakeVLLMServer(FakeConfig(responder=responder)) as srv:
        yield srv


@pytest.fixture
def balancer(server: Any) -> Any:
    """verl's `GlobalRequestLoadBalancer` over the fake server (in-flight counts, sticky ids)."""
    return rollout_servers(server.base_url)[1]


@pytest.fixture
def llm_client(balancer: Any) -> Any:
    """verl's `LLMServerClient` over `balancer`: what verl's worker hands the agent loop."""
    from verl.workers.rollout.llm_server import LLMServerClient

    return LLMServerClient(config=trainer_config(), load_balancer_handle=LocalActor(balancer))


async def run(loop: Any, **row: Any) -> Any:
    """`loop.run` as verl's worker calls it (the loop is built inside the running event loop, as
    verl builds it: `AgentLoopBase` keeps that loop)."""
    row.setdefault("raw_prompt", PROMPT)
    return await loop.run({"temperature": 1.0}, **row)


def test_registered_in_verls_registry() -> None:
    registry = agent_loop._agent_loop_registry
    assert registry["tito_agent"] == {"_target_": "tito_agents.rl.verl_loop.TitoAgentLoop"}
    assert issubclass(TitoAgentLoop, agent_loop.AgentLoopBase)


async def test_a_subclass_registered_by_name_runs_its_agent(llm_client: Any) -> None:
    """The verl way without YAML: `@register(name)` on a subclass that sets `agent`."""

    async def solve(prompt: Any, client: Any) -> float:
        await client.chat.completions.create(
            model=await served_model(client), messages=prompt, max_tokens=8
        )
        return 0.5

    @agent_loop.register("solve_agent")
    class SolveLoop(TitoAgentLoop):
        agent = staticmethod(solve)

    assert agent_loop._agent_loop_registry["solve_agent"]["_target_"].endswith("SolveLoop")
    out = await run(make_loop(llm_client, loop_class=SolveLoop))
    assert isinstance(out, agent_loop.AgentLoopOutput) and out.reward_score == 0.5


async def test_run_returns_verls_output_of_a_multi_turn_tool_episode(
    llm_client: Any, balancer: Any
) -> None:
    """A plain openai tool agent, the server from verl's load balancer: one row whose response
    holds both model turns, the tool result between them at mask 0, the sampled tokens' logprobs,
    the agent's reward (from the row's `reward_model`) and the row's global steps."""
    loop = make_loop(llm_client, agent="tests.support.verl_loop:weather_agent")
    out = await run(
        loop, uid="u1", global_steps=torch.tensor(7), reward_model={"ground_truth": "sunny"}
    )

    assert isinstance(out, agent_loop.AgentLoopOutput)
    assert out.reward_score == 1.0 and out.num_turns == 2
    mask = np.asarray(out.response_mask)
    assert len(out.response_ids) == len(mask) == len(out.response_logprobs)
    assert mask[0] == 1 and mask[-1] == 1 and (mask == 0).any()
    tokenizer = load_tokenizer()
    assert OBSERVATION in tokenizer.decode(np.asarray(out.response_ids)[mask == 0].tolist())
    assert "Weather in Paris?" in tokenizer.decode(out.prompt_ids)
    logprobs = np.asarray(out.response_logprobs)
    assert (logprobs[mask == 1] < 0).all() and (logprobs[mask == 0] == 0).all()
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 7
    assert out.extra_fields["uid"] == "u1"
    assert out.extra_fields["tito_failure"] is None
    # the episode's server came from verl's balancer and went back to it
    assert len(balancer._request_id_to_server) == 1
    assert list(balancer._inflight_requests.values()) == [0]


@pytest.mark.parametrize(
    ("agent", "framework"),
    [("langgraph_agent", "langchain"), ("agents_sdk_agent", "agents")],
)
async def test_framework_agents_run_unmodified_as_one_row(
    llm_client: Any, agent: str, framework: str
) -> None:
    """A LangGraph agent (its own `ChatOpenAI` from the loop's `base_url`, wrapped with the
    loop's `collector`) and an Agents SDK agent (on the client handed in): one row each, both
    model turns trained, the tool result between them at mask 0."""
    pytest.importorskip(framework, reason=f"{framework} is not installed")
    out = await run(make_loop(llm_client, agent=f"tests.support.verl_loop:{agent}"))
    assert isinstance(out, agent_loop.AgentLoopOutput), out
    assert out.extra_fields["tito_failure"] is None and out.reward_score == 1.0
    assert out.num_turns == 2
    mask = np.asarray(out.response_mask)
    tool_part = np.asarray(out.response_ids)[mask == 0].tolist()
    assert OBSERVATION in load_tokenizer().decode(tool_part)


async def test_v1_trainer_casts_the_global_steps_of_our_rows(llm_client: Any) -> None:
    """verl's v1 trainer reads the rows' `min/max_global_steps` tags with `dtype=int`
    (`trainer_base.py`); an unset one is None there, a TypeError."""
    loop = make_loop(llm_client, agent="tests.support.verl_loop:weather_agent")
    outs = [
        await run(loop, uid="u", global_steps=3),
        await run(loop, uid="u", global_steps=np.int64(4)),
    ]
    tags = [o.extra_fields for o in outs]
    mins = np.array([t["min_global_steps"] for t in tags], dtype=int)
    maxs = np.array([t["max_global_steps"] for t in tags], dtype=int)
    assert mins.tolist() == maxs.tolist() == [3, 4]
    with pytest.raises(TypeError):
        np.array([None], dtype=int)


async def test_verls_worker_picks_the_loop_by_agent_name_and_batches_its_rows(
    tmp_path: Path, llm_client: Any
) -> None:
    """The highest verl layer that runs on CPU: `AgentLoopWorker` (built from verl's generated
    trainer config, a tiny model folder and the agent-loop YAML) runs a `DataProto` batch whose
    `agent_name` names our loop, and returns verl's batch: `rm_scores` at each row's last token,
    `rollout_log_probs`, `response_mask` with the tool turns at 0."""
    yaml = tmp_path / "agent_loops.yaml"
    yaml.write_text(
        "- name: weather\n"
        "  _target_: tito_agents.rl.verl_loop.TitoAgentLoop\n"
        "  agent: tests.support.verl_loop:weather_agent\n"
    )
    config = trainer_config(model_dir(tmp_path), yaml)
    worker = agent_loop.AgentLoopWorker(config, llm_client=llm_client)
    from verl.protocol import DataProto

    n = 3
    batch = DataProto.from_dict(
        tensors={"dummy": torch.zeros(n, 1)},
        non_tensors={
            "raw_prompt": np.array([PROMPT] * n, dtype=object),
            "agent_name": np.array(["weather"] * n, dtype=object),
            "uid": np.array(["g0", "g0", "g1"], dtype=object),
            "reward_model": np.array([{"ground_truth": "sunny"}] * 2 + [{"ground_truth": "x"}]),
        },
        meta_info={"global_steps": 1},
    )
    data = await worker.generate_sequences(batch)

    response_length = config.actor_rollout_ref.rollout.response_length
    assert data.batch["responses"].shape == (n, response_length)
    scores = data.batch["rm_scores"].sum(dim=1).tolist()
    assert scores == [1.0, 1.0, 0.0]
    mask = data.batch["response_mask"]
    assert ((mask == 0) & (data.batch["attention_mask"][:, -response_length:] == 1)).any()
    logprobs = data.batch["rollout_log_probs"]
    assert (logprobs[mask == 1] < 0).all()
    assert data.non_tensor_batch["__num_turns__"].tolist() == [2, 2, 2]


async def test_failed_episodes_give_rows_that_train_nothing(llm_client: Any) -> None:
    """An agent that raises, makes no captured call, or returns a reward that is not a finite
    number: a row verl batches like any other (mask 0, reward 0.0, logprobs 0.0) saying why."""
    FAILURES.clear()

    async def raises(prompt: Any, client: Any) -> float:
        raise RuntimeError("tool backend down")

    async def no_call(prompt: Any, client: Any) -> float:
        return 1.0

    def returning(value: Any) -> Any:
        async def agent(prompt: Any, client: Any) -> Any:
            await client.chat.completions.create(
                model=await served_model(client), messages=prompt, max_tokens=4
            )
            return value

        return agent

    agents = [raises, no_call] + [returning(v) for v in (math.nan, math.inf, 1e39, "1.0", None)]
    outs = []
    for agent in agents:
        loop = make_loop(llm_client, loop_class=type("L", (TitoAgentLoop,), {"agent": agent}))
        outs.append(await run(loop, global_steps=2))
    no_prompt = await run(
        make_loop(llm_client, agent="tests.support.verl_loop:weather_agent"),
        raw_prompt=None,
        global_steps=2,
    )
    assert FAILURES == {"agent_error": 1, "no_call": 1, "bad_reward": 5, "no_prompt": 1}
    assert "no raw_prompt" in no_prompt.extra_fields["tito_failure"]
    assert no_prompt.response_mask == [0] and no_prompt.prompt_ids
    reasons = [o.extra_fields["tito_failure"] for o in outs]
    assert "RuntimeError: tool backend down" in reasons[0]
    assert "no captured call" in reasons[1]
    assert "nan" in reasons[2] and "inf" in reasons[3] and "1e+39" in reasons[4]
    assert "'1.0', not a number" in reasons[5] and "no reward" in reasons[6]
    for out in outs:
        assert isinstance(out, agent_loop.AgentLoopOutput)
        assert out.response_mask == [0] and out.reward_score == 0.0
        assert out.response_logprobs == [0.0] and out.prompt_ids
        assert out.extra_fields["min_global_steps"] == 2


async def test_a_numpy_reward_is_a_number(llm_client: Any) -> None:
    async def agent(prompt: Any, client: Any) -> Any:
        await client.chat.completions.create(
            model=await served_model(client), messages=prompt, max_tokens=4
        )
        return np.float32(0.5)

    loop = make_loop(llm_client, loop_class=type("L", (TitoAgentLoop,), {"agent": agent}))
    out = await run(loop)
    assert out.extra_fields["tito_failure"] is None and out.reward_score == 0.5


async def test_a_failed_row_batches_beside_good_ones_in_verls_postprocess(
    llm_client: Any,
) -> None:
    """verl concatenates `rollout_log_probs` of all rows or none: the failed row has its own."""

    async def raises(prompt: Any, client: Any) -> float:
        raise ValueError("boom")

    good = await run(make_loop(llm_client, agent="tests.support.verl_loop:weather_agent"))
    bad = await run(
        make_loop(llm_client, loop_class=type("L", (TitoAgentLoop,), {"agent": raises}))
    )
    worker = object.__new__(agent_loop.AgentLoopWorker)
    worker.tokenizer = load_tokenizer()
    worker.processor = None
    worker.rollout_config = trainer_config().actor_rollout_ref.rollout
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.mm_processor_kwargs = None

    async def postprocess() -> list[Any]:
        return [
            await worker._agent_loop_postprocess(o, validate=False, raw_prompt=PROMPT)
            for o in (good, bad)
        ]

    data = worker._postprocess(await postprocess())
    assert data.batch["rm_scores"].sum(dim=1).tolist() == [1.0, 0.0]
    assert data.batch["response_mask"][1].sum().item() == 0
    assert data.non_tensor_batch["tito_failure"].tolist()[0] is None


async def test_a_response_longer_than_verls_response_length_is_cut_as_verl_cuts(
    llm_client: Any,
) -> None:
    """verl pads every row to `rollout.response_length` and cannot take a longer one: the tail
    goes, as in verl's own loops; ids, mask and logprobs stay aligned."""
    full = await run(make_loop(llm_client, agent="tests.support.verl_loop:weather_agent"))
    loop = make_loop(llm_client, agent="tests.support.verl_loop:weather_agent", response_length=8)
    cut = await run(loop)
    assert len(full.response_ids) > 8
    assert cut.response_ids == full.response_ids[:8]
    assert cut.response_mask == full.response_mask[:8]
    assert len(cut.response_logprobs) == 8 and cut.prompt_ids == full.prompt_ids


async def test_all_equal_rewards_give_zero_advantage_in_verls_grpo(llm_client: Any) -> None:
    """A group whose episodes all score the same: verl's GRPO gives every token advantage 0."""
    loop = make_loop(llm_client, agent="tests.support.verl_loop:weather_agent")
    outs = [await run(loop, uid="g") for _ in range(3)]
    assert {o.reward_score for o in outs} == {1.0}
    width = max(len(o.response_ids) for o in outs)
    scores = torch.zeros(len(outs), width)
    mask = torch.zeros(len(outs), width)
    for row, o in enumerate(outs):
        scores[row, len(o.response_ids) - 1] = o.reward_score
        mask[row, : len(o.response_ids)] = torch.tensor(o.response_mask, dtype=torch.float32)
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        scores, mask, np.array(["g"] * len(outs), dtype=object)
    )
    assert torch.count_nonzero(advantages) == 0


async def test_linked_segments_are_rows_sharing_the_reward_where_the_worker_takes_a_list(
    llm_client: Any,
) -> None:
    """v1's `AgentLoopWorkerTQ` (it passes `session_id`) takes a list: one row per segment,
    each with the episode's reward and one trajectory id."""
    loop = make_loop(
        llm_client, loop_class=type("L", (TitoAgentLoop,), {"agent": two_conversations})
    )
    outs = await run(loop, uid="g", session_id=0, global_steps=5)
    assert isinstance(outs, list) and len(outs) == 2
    assert [o.reward_score for o in outs] == [0.75, 0.75]
    assert len({o.extra_fields["trajectory_id"] for o in outs}) == 1
    assert [o.extra_fields["segment_index"] for o in outs] == [0, 1]


async def test_linked_segments_are_refused_with_the_reason_by_the_classic_worker(
    llm_client: Any,
) -> None:
    FAILURES.clear()
    loop = make_loop(
        llm_client, loop_class=type("L", (TitoAgentLoop,), {"agent": two_conversations})
    )
    out = await run(loop, uid="g")
    assert isinstance(out, agent_loop.AgentLoopOutput) and out.response_mask == [0]
    assert "2 linked segments" in out.extra_fields["tito_failure"]
    assert "v1 trainer" in out.extra_fields["tito_failure"]
    assert FAILURES == {"segments": 1}


async def test_a_base_url_in_the_yaml_replaces_verls_servers(server: Any) -> None:
    class NoServers:
        async def _acquire_server(self, request_id: str) -> Any:
            raise AssertionError("the load balancer is not asked")

    loop = make_loop(
        NoServers(), agent="tests.support.verl_loop:weather_agent", base_url=server.base_url
    )
    assert (await run(loop)).reward_score == 1.0


def test_an_unsupported_verl_is_named_with_the_supported_ones() -> None:
    check_verl_version(SUPPORTED_VERL[0])
    with pytest.raises(ImportError, match=r"supports verl 0\.9\.1, not 0\.8\.0"):
        check_verl_version("0.8.0")


async def test_a_loop_without_an_agent_or_with_a_bad_path_says_what_to_write(
    llm_client: Any,
) -> None:
    from tito_agents.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="agent: module:function"):
        make_loop(llm_client)
    with pytest.raises(ConfigurationError, match="must be 'module:function'"):
        make_loop(llm_client, agent="tests.support.verl_loop.weather_agent")
    with pytest.raises(ConfigurationError, match="async def"):
        make_loop(llm_client, agent="tests.support.verl_loop:address_of")
    assert verl_loop.load_agent("tests.support.verl_loop:weather_agent").__name__ == (
        "weather_agent"
    )
