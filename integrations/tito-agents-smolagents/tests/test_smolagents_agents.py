"""smolagents against the fake vLLM: the quickstart tool-calling agent and a manager with a
managed agent, in 8 concurrent episodes (threads: smolagents is synchronous), run whole or with
the steps and the model's output streamed.
Every request the server answered is a captured call of the right episode, labelled with the
agent that made it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import tito_agents_smolagents
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


@tool
def get_weather(city: str) -> str:
    """Get the weather in a city.

    Args:
        city: The city.
    """
    return f"It is sunny in {city}."


def _forecaster(client: openai.OpenAI, stream: bool = False) -> ToolCallingAgent:
    """smolagents' quickstart on the documented line: a tool-calling agent, one tool (its model
    streamed with `stream`)."""
    model = OpenAIServerModel(model_id=MODEL_NAME, client=client)
    return ToolCallingAgent(
        tools=[get_weather],
        model=model,
        name="forecaster",
        description="Knows the weather of any city.",
        max_steps=3,
        verbosity_level=0,
        stream_outputs=stream,
    )


def _manager(client: openai.OpenAI, stream: bool = False) -> ToolCallingAgent:
    """A manager whose managed agent is the forecaster (smolagents' multi-agent example)."""
    model = OpenAIServerModel(model_id=MODEL_NAME, client=client)
    return ToolCallingAgent(
        tools=[],
        model=model,
        managed_agents=[_forecaster(client, stream)],
        name="manager",
        max_steps=3,
        verbosity_level=0,
        stream_outputs=stream,
    )


def _run(agent: ToolCallingAgent, prompt: str, stream: bool) -> None:
    if stream:
        for _ in agent.run(prompt, stream=True):
            pass
    else:
        agent.run(prompt)


@pytest.mark.parametrize("stream", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [
        (_forecaster, ["forecaster", "forecaster"]),
        (_manager, ["manager", "forecaster", "forecaster", "manager"]),
    ],
    ids=["quickstart", "managed-agent"],
)
def test_8_concurrent_episodes_are_captured_per_agent(
    smol_server: FakeVLLMServer,
    make: Callable[[openai.OpenAI, bool], ToolCallingAgent],
    agents: list[str],
    stream: bool,
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the agent that made it, every sample with ids."""
    sent_before = smol_server.stats[CHAT]
    with (
        openai.OpenAI(base_url=smol_server.base_url, api_key="x") as client,
        tito.Collector() as collector,
    ):
        collector.wrap(client)

        def rollout(city: str) -> tito.Episode:
            agent = make(client, stream)
            with collector.episode(task_id=city) as ep:
                _run(agent, f"what is the weather in {city}", stream)
            return ep

        with ThreadPoolExecutor(len(CITIES)) as pool:
            episodes = list(pool.map(rollout, CITIES))
        samples = captured_samples(collector)
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == smol_server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == agents
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each


def test_without_the_documented_line_nothing_is_captured(smol_server: FakeVLLMServer) -> None:
    """smolagents' own client: the episode ends empty and says no capturing client was used."""
    with (
        openai.OpenAI(base_url=smol_server.base_url, api_key="x") as plain,
        tito.Collector() as collector,
        collector.episode() as ep,
    ):
        _forecaster(plain).run("what is the weather in Oslo")
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    smol_server: FakeVLLMServer,
) -> None:
    with (
        openai.OpenAI(base_url=smol_server.base_url, api_key="x") as client,
        tito.Collector() as collector,
    ):
        agent = _forecaster(collector.wrap(client))
        with collector.episode() as ep:
            with tito.agent("override"):
                agent.run("what is the weather in Lima")
            tito_agents_smolagents.uninstall()
            agent.run("what is the weather in Quito")
    assert [c.agent for c in ep.calls] == ["override", "override", None, None]


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(
        ConfigurationError, match=r"smolagents 1\.20\.0 .*supported: smolagents >=1\.26"
    ):
        tito_agents_smolagents.check_smolagents_version("1.20.0")
