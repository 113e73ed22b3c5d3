"""CrewAI against the fake vLLM over HTTP: the quickstart one-agent crew, a two-agent crew (a
researcher, then a writer) and a manager delegating to a coworker, in 8 concurrent episodes
(threads: `kickoff` is synchronous) or `kickoff_async`, on the documented line (`wrap_llm`).
Every request the server answered is a captured call of the right episode, labelled with the
role of the agent that made it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import tito_agents_crewai
from crewai import LLM, Agent, Crew, Process, Task

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


def _llm(server: FakeVLLMServer) -> LLM:
    return LLM(model=f"hosted_vllm/{MODEL_NAME}", base_url=server.base_url, api_key="x")


def _agent(role: str, llm: LLM) -> Agent:
    return Agent(role=role, goal=f"Do a {role}'s work", backstory="You are good at it.", llm=llm)


def _quickstart(llm: LLM) -> Crew:
    """CrewAI's quickstart: one agent, one task."""
    researcher = _agent("Researcher", llm)
    task = Task(
        description="Research the weather in {city}.", expected_output="facts", agent=researcher
    )
    return Crew(agents=[researcher], tasks=[task])


def _two_agents(llm: LLM) -> Crew:
    """A researcher, then a writer who uses the research (a sequential crew)."""
    researcher, writer = _agent("Researcher", llm), _agent("Writer", llm)
    research = Task(
        description="Research the weather in {city}.", expected_output="facts", agent=researcher
    )
    write = Task(
        description="Write about the weather in {city}.", expected_output="a line", agent=writer
    )
    return Crew(agents=[researcher, writer], tasks=[research, write], process=Process.sequential)


def _hierarchical(llm: LLM) -> Crew:
    """A manager that delegates its task to a coworker (CrewAI's hierarchical process): the
    coworker's calls run inside the manager's task, under its own role."""
    task = Task(description="Find the weather in {city}.", expected_output="a line")
    agents = [_agent("Researcher", llm), _agent("Writer", llm)]
    return Crew(agents=agents, tasks=[task], process=Process.hierarchical, manager_llm=llm)


@pytest.mark.parametrize("run_async", [False, True], ids=["threads", "kickoff_async"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [
        (_quickstart, ["Researcher"]),
        (_two_agents, ["Researcher", "Writer"]),
        (_hierarchical, ["Crew Manager", "Researcher", "Crew Manager"]),
    ],
    ids=["quickstart", "two-agents", "delegation"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    crew_server: FakeVLLMServer,
    make: Callable[[LLM], Crew],
    agents: list[str],
    run_async: bool,
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the role of the agent that made it, every sample with ids."""
    sent_before = crew_server.stats[CHAT]
    with tito.Collector() as collector:

        def rollout(city: str) -> tito.Episode:
            crew = make(tito_agents_crewai.wrap_llm(collector, _llm(crew_server)))
            with collector.episode(task_id=city) as ep:
                crew.kickoff(inputs={"city": city})
            return ep

        async def arollout(city: str) -> tito.Episode:
            crew = make(tito_agents_crewai.wrap_llm(collector, _llm(crew_server)))
            async with collector.episode(task_id=city) as ep:
                await crew.kickoff_async(inputs={"city": city})
            return ep

        if run_async:
            episodes = list(await asyncio.gather(*(arollout(city) for city in CITIES)))
        else:
            with ThreadPoolExecutor(len(CITIES)) as pool:
                episodes = list(pool.map(rollout, CITIES))
        samples = captured_samples(collector)
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == crew_server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == agents
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each


def test_without_the_documented_line_nothing_is_captured(crew_server: FakeVLLMServer) -> None:
    """The LLM's own clients: the episode ends empty and says no capturing client was used."""
    with tito.Collector() as collector, collector.episode() as ep:
        _quickstart(_llm(crew_server)).kickoff(inputs={"city": "Oslo"})
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    crew_server: FakeVLLMServer,
) -> None:
    with tito.Collector() as collector:
        llm = tito_agents_crewai.wrap_llm(collector, _llm(crew_server))
        with collector.episode() as ep:
            with tito.agent("override"):
                _quickstart(llm).kickoff(inputs={"city": "Lima"})
            tito_agents_crewai.uninstall()
            _quickstart(llm).kickoff(inputs={"city": "Quito"})
    assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == ["override", None]


def test_an_llm_without_its_own_clients_is_refused_naming_litellm() -> None:
    with (
        tito.Collector() as collector,
        pytest.raises(ConfigurationError, match="tito_agents_litellm"),
    ):
        tito_agents_crewai.wrap_llm(collector, object())


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"CrewAI 0\.100\.0 .*supported: CrewAI >=1\.15"):
        tito_agents_crewai.check_crewai_version("0.100.0")
