"""Agno agents against the fake vLLM: the quickstart tool agent and a team that delegates to it,
in 8 concurrent episodes, streamed or not. Every request the server answered is a captured call
of the right episode, labelled with the agent (or team) that made it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import tito_agents_agno
from agno.agent import Agent
from agno.models.vllm import VLLM
from agno.team import Team

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeVLLMServer,
    default_responder,
    hermes_tool_call,
)
from tito_agents.testing.fake_vllm._model import RequestView
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return f"It is sunny in {city}."


def _delegating_responder(view: RequestView) -> str:
    """The fake model as a team leader: it delegates the user's message to the forecaster (once),
    and otherwise says what the default responder says."""
    tools = {(t.get("function") or {}).get("name") for t in view.tools or []}
    delegated = any(m.get("role") == "tool" for m in view.messages)
    if "delegate_task_to_member" in tools and not delegated:
        task = next(str(m["content"]) for m in view.messages if m.get("role") == "user")
        return hermes_tool_call(
            "delegate_task_to_member", {"member_id": "forecaster", "task": task}
        )
    return default_responder(view)


@pytest.fixture(scope="module")
def team_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=_delegating_responder)) as server:
        yield server


@contextlib.asynccontextmanager
async def _model(
    server: FakeVLLMServer, collector: tito.Collector, wrapped: bool = True
) -> AsyncIterator[VLLM]:
    """The documented line: Agno's vLLM model on wrapped openai clients."""
    url = server.base_url

    def wrap(client: Any) -> Any:
        return collector.wrap(client) if wrapped else client

    with openai.OpenAI(base_url=url, api_key="x") as client:
        async with openai.AsyncOpenAI(base_url=url, api_key="x") as async_client:
            yield VLLM(
                id=MODEL_NAME,
                base_url=url,
                api_key="x",
                client=wrap(client),
                async_client=wrap(async_client),
            )


def _forecaster(model: VLLM) -> Agent:
    """Agno's quickstart agent: one tool."""
    return Agent(model=model, name="forecaster", tools=[get_weather])


async def _run(runner: Agent | Team, prompt: str, stream: bool) -> None:
    if stream:
        async for _ in runner.arun(prompt, stream=True):
            pass
    else:
        await runner.arun(prompt)


async def _concurrently(
    collector: tito.Collector,
    runner: Agent | Team,
    server: FakeVLLMServer,
    prompt: str,
    stream: bool,
) -> list[tito.Episode]:
    sent_before = server.stats[CHAT]

    async def rollout(city: str) -> tito.Episode:
        async with collector.episode(task_id=city) as ep:
            await _run(runner, prompt.format(city=city), stream)
        return ep

    episodes = await asyncio.gather(*(rollout(city) for city in CITIES))
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
    samples = captured_samples(collector)
    assert samples and all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each
    return episodes


@pytest.mark.parametrize("stream", [False, True], ids=["arun", "stream"])
async def test_the_quickstart_agent_in_8_concurrent_episodes(
    agno_server: FakeVLLMServer, stream: bool
) -> None:
    """The tool call and the answer after it, each episode's own, both named `forecaster`."""
    async with tito.Collector() as collector, _model(agno_server, collector) as model:
        agent = _forecaster(model)
        prompt = "what is the weather in {city}"
        episodes = await _concurrently(collector, agent, agno_server, prompt, stream)
    for ep in episodes:
        assert [c.agent for c in ep.calls] == ["forecaster", "forecaster"]
        assert ep.calls[1].messages[-1]["role"] == "tool"  # the answer after the tool's result


@pytest.mark.parametrize("stream", [False, True], ids=["arun", "stream"])
async def test_a_team_delegating_to_its_member_in_8_concurrent_episodes(
    team_server: FakeVLLMServer, stream: bool
) -> None:
    """The team leader's calls carry the team's name, the member's calls (inside the leader's
    delegation tool) its own; none misattributed."""
    async with tito.Collector() as collector, _model(team_server, collector) as model:
        team = Team(members=[_forecaster(model)], model=model, name="coordinator")
        prompt = "what is the weather in {city}"
        episodes = await _concurrently(collector, team, team_server, prompt, stream)
    for ep in episodes:
        calls = sorted(ep.calls, key=lambda c: c.seq)
        assert [c.agent for c in calls] == [
            "coordinator",
            "forecaster",
            "forecaster",
            "coordinator",
        ]
        for call in calls:  # each call offered its own agent's tools only
            tools = {t["function"]["name"] for t in call.tools or []}
            assert ("get_weather" in tools) == (call.agent == "forecaster")


async def test_the_http_client_route_takes_a_plain_httpx_client(
    agno_server: FakeVLLMServer,
) -> None:
    """Agno keeps an `http_client` only if it is an `httpx.AsyncClient`: `library="httpx"`."""
    async with tito.Collector() as collector:
        host = urlsplit(agno_server.base_url).netloc
        async with collector.http_client([host], library="httpx") as http_client:
            model = VLLM(
                id=MODEL_NAME, base_url=agno_server.base_url, api_key="x", http_client=http_client
            )
            async with collector.episode() as ep:
                await _forecaster(model).arun("what is the weather in Paris")
    assert [c.agent for c in ep.calls] == ["forecaster", "forecaster"]


async def test_without_the_documented_line_nothing_is_captured(
    agno_server: FakeVLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Agno's own clients: the episode ends empty, and names Agno's fix."""
    async with tito.Collector() as collector, _model(agno_server, collector, False) as model:
        with caplog.at_level(logging.WARNING, "tito_agents"):
            async with collector.episode() as ep:
                await _forecaster(model).arun("what is the weather in Oslo")
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT
    assert "docs/frameworks.md#agno" in caplog.text


async def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    agno_server: FakeVLLMServer,
) -> None:
    async with tito.Collector() as collector, _model(agno_server, collector) as model:
        agent = _forecaster(model)
        async with collector.episode() as ep:
            with tito.agent("override"):
                await agent.arun("hello there")
            tito_agents_agno.uninstall()
            await agent.arun("hello again")
    assert [c.agent for c in ep.calls] == ["override", "override", None, None]


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"agno 2\.5\.0 .*supported: agno >=3\.1,<3\.2"):
        tito_agents_agno.check_agno_version("2.5.0")
