"""AutoGen against the fake vLLM: the quickstart tool agent and a round-robin team of two
agents, in 8 concurrent episodes, run whole or with `run_stream` and the model streamed. Every
request the server answered is a captured call of the right episode, labelled with the agent that
made it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

pytest.importorskip(
    "autogen_agentchat",
    reason="autogen-agentchat is not installed here (its protobuf 5 pin clashes with the dev "
    "environment): these tests run in their own environment, make test-apart",
)

import tito_agents_autogen
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")
MODEL_INFO: Any = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "structured_output": False,
    "family": "unknown",
}


async def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return f"It is sunny in {city}."


def _model(server: FakeVLLMServer, http_client: Any) -> OpenAIChatCompletionClient:
    """The documented line: AutoGen's openai client on a capturing HTTP client."""
    return OpenAIChatCompletionClient(
        model=MODEL_NAME,
        base_url=server.base_url,
        api_key="x",
        model_info=MODEL_INFO,
        http_client=http_client,
    )


def _forecaster(model: OpenAIChatCompletionClient, stream: bool = False) -> Any:
    """AutoGen's quickstart agent: one tool (the model's output streamed with `stream`)."""
    return AssistantAgent(
        "forecaster", model_client=model, tools=[get_weather], model_client_stream=stream
    )


def _team(model: OpenAIChatCompletionClient, stream: bool = False) -> Any:
    """Two agents taking turns (AutoGen's round-robin team): one model call each."""
    writer = AssistantAgent(
        "writer", model_client=model, system_message="Write a line.", model_client_stream=stream
    )
    critic = AssistantAgent(
        "critic", model_client=model, system_message="Criticise it.", model_client_stream=stream
    )
    return RoundRobinGroupChat([writer, critic], termination_condition=MaxMessageTermination(3))


async def _run(runner: Any, prompt: str, stream: bool) -> None:
    if stream:
        async for _ in runner.run_stream(task=prompt):
            pass
    else:
        await runner.run(task=prompt)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [(_forecaster, ["forecaster"]), (_team, ["writer", "critic"])],
    ids=["quickstart", "team"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    server: FakeVLLMServer, make: Callable[[Any, bool], Any], agents: list[str], stream: bool
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the agent that made it, every sample with ids."""
    sent_before = server.stats[CHAT]
    async with (
        tito.Collector() as collector,
        collector.http_client([urlsplit(server.base_url).netloc]) as http_client,
    ):
        model = _model(server, http_client)

        async def rollout(city: str) -> tito.Episode:
            runner = make(model, stream)  # AutoGen agents keep their history: one per episode
            async with collector.episode(task_id=city) as ep:
                await _run(runner, f"what is the weather in {city}", stream)
            return ep

        episodes = await asyncio.gather(*(rollout(city) for city in CITIES))
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == agents
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
    samples = captured_samples(collector)
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each


async def test_without_the_documented_line_nothing_is_captured(server: FakeVLLMServer) -> None:
    """AutoGen's own HTTP client: the episode ends empty and says no capturing client was
    used."""
    model = OpenAIChatCompletionClient(
        model=MODEL_NAME, base_url=server.base_url, api_key="x", model_info=MODEL_INFO
    )
    async with tito.Collector() as collector, collector.episode() as ep:
        await _forecaster(model).run(task="what is the weather in Oslo")
    await model.close()
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


async def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    server: FakeVLLMServer,
) -> None:
    async with (
        tito.Collector() as collector,
        collector.http_client([urlsplit(server.base_url).netloc]) as http_client,
    ):
        model = _model(server, http_client)
        async with collector.episode() as ep:
            with tito.agent("override"):
                await _forecaster(model).run(task="hello there")
            tito_agents_autogen.uninstall()
            await _forecaster(model).run(task="hello again")
    assert [c.agent for c in ep.calls] == ["override", None]


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"autogen-agentchat 0\.4\.0 .*supported"):
        tito_agents_autogen.check_autogen_version("0.4.0")
