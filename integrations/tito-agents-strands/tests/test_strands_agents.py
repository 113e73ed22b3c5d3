"""Strands agents against the fake vLLM: the quickstart tool agent, and a coordinator whose tool
runs a researcher agent, in 8 concurrent episodes, invoked or streamed. Every request the server
answered is a captured call of the right episode, labelled with the agent that made it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import openai
import pytest
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from tito_agents_strands import AgentNames

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


@pytest.fixture(scope="module")
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as fake:
        yield fake


@tool
def get_weather(city: str) -> str:
    """Get the weather in a city.

    Args:
        city: The city.
    """
    return f"It is sunny in {city}."


def _model(client: openai.AsyncOpenAI) -> OpenAIModel:
    """The documented line: Strands' OpenAI model reusing a wrapped client."""
    return OpenAIModel(client=client, model_id=MODEL_NAME)


def _forecaster(client: openai.AsyncOpenAI) -> Agent:
    """Strands' quickstart agent: one tool."""
    return Agent(
        model=_model(client),
        name="forecaster",
        tools=[get_weather],
        plugins=[AgentNames()],
        callback_handler=None,
    )


def _coordinator(client: openai.AsyncOpenAI) -> Agent:
    """An agent whose tool runs another agent (Strands' "agents as tools")."""
    researcher = Agent(
        model=_model(client), name="researcher", plugins=[AgentNames()], callback_handler=None
    )

    @tool
    async def ask_researcher(question: str) -> str:
        """Ask the researcher agent a question.

        Args:
            question: The question.
        """
        return str(await researcher.invoke_async(question))

    return Agent(
        model=_model(client),
        name="coordinator",
        tools=[ask_researcher],
        plugins=[AgentNames()],
        callback_handler=None,
    )


async def _run(agent: Agent, prompt: str, stream: bool) -> None:
    if stream:
        async for _ in agent.stream_async(prompt):
            pass
    else:
        await agent.invoke_async(prompt)


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [
        (_forecaster, ["forecaster", "forecaster"]),
        (_coordinator, ["coordinator", "researcher", "coordinator"]),
    ],
    ids=["quickstart", "agent-as-tool"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    server: FakeVLLMServer, make: object, agents: list[str], stream: bool
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the agent that made it, every sample with ids, no model call unaccounted for."""
    sent_before = server.stats[CHAT]
    async with (
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as client,
        tito.Collector() as collector,
    ):
        collector.wrap(client)

        async def rollout(city: str) -> tito.Episode:
            agent = make(client)  # type: ignore[operator]
            async with collector.episode(task_id=city) as ep:
                await _run(agent, f"what is the weather in {city}", stream)
            return ep

        episodes = await asyncio.gather(*(rollout(city) for city in CITIES))
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == agents
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
        assert ep.report.bypassed_calls == 0
    samples = captured_samples(collector)
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each
    assert collector.stats.bypassed_calls == 0


async def test_a_model_on_an_unwrapped_client_is_reported_as_bypassed(
    server: FakeVLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the documented line (a client capture never saw) the episode ends empty, its
    calls counted as bypassed and Strands' fix named."""
    async with (
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as plain,
        tito.Collector() as collector,
    ):
        with caplog.at_level(logging.WARNING, "tito_agents"):
            async with collector.episode("lost") as ep:
                await _forecaster(plain).invoke_async("what is the weather in Oslo")
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.BYPASSED_CAPTURE
    assert ep.report.bypassed_calls == 2
    assert "docs/frameworks.md#strands" in caplog.text


async def test_an_explicit_scope_wins(server: FakeVLLMServer) -> None:
    async with (
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as client,
        tito.Collector() as collector,
    ):
        collector.wrap(client)
        async with collector.episode() as ep:
            with tito.agent("override"):
                await _forecaster(client).invoke_async("hello there")
    assert {c.agent for c in ep.calls} == {"override"}
