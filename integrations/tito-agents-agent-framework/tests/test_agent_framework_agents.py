"""Agent Framework agents against the fake vLLM: the quickstart tool agent, and a coordinator
that uses a researcher agent as its tool (`as_tool()`), in 8 concurrent episodes, run or
streamed. Every request the server answered is a captured call of the right episode, labelled
with the agent that made it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import openai
import pytest
from agent_framework import Agent
from agent_framework.openai import OpenAIChatCompletionClient
from tito_agents_agent_framework import AgentNames

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


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return f"It is sunny in {city}."


def _chat(client: openai.AsyncOpenAI) -> OpenAIChatCompletionClient:
    """The documented line: the chat client on a wrapped openai client."""
    return OpenAIChatCompletionClient(model=MODEL_NAME, async_client=client)


def _forecaster(client: openai.AsyncOpenAI) -> Agent:
    """Agent Framework's quickstart agent: one tool."""
    return Agent(
        client=_chat(client), name="forecaster", tools=[get_weather], middleware=[AgentNames()]
    )


def _coordinator(client: openai.AsyncOpenAI) -> Agent:
    """A coordinator whose tool is a researcher agent."""
    researcher = Agent(
        client=_chat(client),
        name="researcher",
        instructions="Answer briefly.",
        middleware=[AgentNames()],
    )
    return Agent(
        client=_chat(client),
        name="coordinator",
        tools=[researcher.as_tool()],
        middleware=[AgentNames()],
    )


async def _run(agent: Agent, prompt: str, stream: bool) -> None:
    if stream:
        updates = agent.run(prompt, stream=True)
        async for _ in updates:
            pass
        assert (await updates.get_final_response()).text
    else:
        assert (await agent.run(prompt)).text


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [
        (_forecaster, ["forecaster", "forecaster"]),
        (_coordinator, ["coordinator", "researcher", "coordinator"]),
    ],
    ids=["quickstart", "agent-as-tool"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    server: FakeVLLMServer,
    make: Callable[[openai.AsyncOpenAI], Agent],
    agents: list[str],
    stream: bool,
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the agent that made it, every sample with ids."""
    sent_before = server.stats[CHAT]
    async with (
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as client,
        tito.Collector() as collector,
    ):
        collector.wrap(client)
        agent = make(client)

        async def rollout(city: str) -> tito.Episode:
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
    samples = captured_samples(collector)
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each


async def test_without_the_documented_line_nothing_is_captured(server: FakeVLLMServer) -> None:
    """The chat client's own openai client: the episode ends empty and says no capturing client
    was used."""
    async with (
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as plain,
        tito.Collector() as collector,
        collector.episode() as ep,
    ):
        await _forecaster(plain).run("what is the weather in Oslo")
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


async def test_an_explicit_scope_wins_and_an_agent_without_the_middleware_is_unnamed(
    server: FakeVLLMServer,
) -> None:
    async with (
        openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as client,
        tito.Collector() as collector,
    ):
        collector.wrap(client)
        plain = Agent(client=_chat(client), name="plain")
        async with collector.episode() as ep:
            with tito.agent("override"):
                await _forecaster(client).run("hello there")
            await plain.run("hello again")
    assert [c.agent for c in ep.calls] == ["override", "override", None]
