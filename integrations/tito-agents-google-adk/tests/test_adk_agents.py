"""Google ADK against the fake vLLM over HTTP: the quickstart weather agent and a coordinator
that transfers to it (a root agent with a sub-agent), in 8 concurrent episodes, streamed or not,
through `LiteLlm` on both of LiteLLM's routes to vLLM (`openai/` with a wrapped client, and
`hosted_vllm/` with LiteLLM's capture). Every request the server answered is a captured call of
the right episode, labelled with the agent that made it; an agent run as another's tool
(`AgentTool`) keeps its own name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import openai
import pytest
import tito_agents_google_adk
import tito_agents_litellm
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


def get_weather(city: str) -> dict[str, str]:
    """Retrieves the current weather report for a specified city."""
    return {"status": "success", "report": f"It is sunny in {city}."}


def _weather_agent(model: LiteLlm) -> LlmAgent:
    """ADK's quickstart: one agent, one tool."""
    return LlmAgent(
        name="weather_agent",
        model=model,
        description="Answers questions about the weather in a city.",
        instruction="Use get_weather to answer.",
        tools=[get_weather],
    )


def _coordinator(model: LiteLlm) -> LlmAgent:
    """A root agent with the weather agent as its sub-agent (ADK's agent team)."""
    return LlmAgent(
        name="coordinator",
        model=model,
        description="Routes each question to the right agent.",
        instruction="Transfer weather questions to weather_agent.",
        sub_agents=[_weather_agent(model)],
    )


def _agent_as_tool(model: LiteLlm) -> LlmAgent:
    """A coordinator that calls the weather agent as a tool (`AgentTool`): the weather agent's
    calls run inside the coordinator's tool call, under its own name."""
    return LlmAgent(
        name="coordinator",
        model=model,
        description="Answers with the help of the weather agent.",
        instruction="Ask weather_agent about the weather.",
        tools=[AgentTool(agent=_weather_agent(model))],
    )


@asynccontextmanager
async def _model(
    server: FakeVLLMServer, collector: tito.Collector, prefix: str
) -> AsyncIterator[LiteLlm]:
    """The documented line on each route: `openai/` with a wrapped client, `hosted_vllm/` with
    LiteLLM's capture installed."""
    if prefix == "openai":
        client = collector.wrap(openai.AsyncOpenAI(base_url=server.base_url, api_key="x"))
        async with client:
            yield LiteLlm(f"openai/{MODEL_NAME}", api_base=server.base_url, client=client)
    else:
        host = urlsplit(server.base_url).netloc
        with tito_agents_litellm.install(collector, vllm_hosts=[host]):
            yield LiteLlm(f"hosted_vllm/{MODEL_NAME}", api_base=server.base_url)


async def _run(agent: LlmAgent, prompt: str, stream: bool) -> None:
    runner = InMemoryRunner(agent=agent, app_name="weather")
    session = await runner.session_service.create_session(app_name="weather", user_id="u")
    mode = StreamingMode.SSE if stream else StreamingMode.NONE
    message = types.Content(role="user", parts=[types.Part(text=prompt)])
    async for _ in runner.run_async(
        user_id="u",
        session_id=session.id,
        new_message=message,
        run_config=RunConfig(streaming_mode=mode),
    ):
        pass


@pytest.mark.parametrize(
    ("prefix", "stream"),
    [("openai", False), ("openai", True), ("hosted_vllm", True)],
    ids=["openai", "openai-streamed", "hosted_vllm-streamed"],
)
@pytest.mark.parametrize(
    ("make", "agents"),
    [
        (_weather_agent, ["weather_agent", "weather_agent"]),
        (_coordinator, ["coordinator", "weather_agent", "weather_agent"]),
        (_agent_as_tool, ["coordinator", "weather_agent", "weather_agent", "coordinator"]),
    ],
    ids=["quickstart", "sub-agent", "agent-tool"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    adk_server: FakeVLLMServer,
    make: Callable[[LiteLlm], LlmAgent],
    agents: list[str],
    prefix: str,
    stream: bool,
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the agent that made it, every sample with ids."""
    sent_before = adk_server.stats[CHAT]
    async with tito.Collector() as collector, _model(adk_server, collector, prefix) as model:

        async def rollout(city: str) -> tito.Episode:
            async with collector.episode(task_id=city) as ep:
                await _run(make(model), f"Ask weather_agent: the weather in {city}?", stream)
            return ep

        episodes = await asyncio.gather(*(rollout(city) for city in CITIES))
        samples = captured_samples(collector)
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == adk_server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == agents
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each


async def test_without_the_documented_line_nothing_is_captured(adk_server: FakeVLLMServer) -> None:
    """LiteLlm's own client: the episode ends empty and says no capturing client was used."""
    model = LiteLlm(f"openai/{MODEL_NAME}", api_base=adk_server.base_url, api_key="x")
    async with tito.Collector() as collector, collector.episode() as ep:
        await _run(_weather_agent(model), "the weather in Oslo?", stream=False)
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


async def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    adk_server: FakeVLLMServer,
) -> None:
    async with (
        tito.Collector() as collector,
        _model(adk_server, collector, "openai") as model,
        collector.episode() as ep,
    ):
        with tito.agent("override"):
            await _run(_weather_agent(model), "the weather in Lima?", stream=False)
        tito_agents_google_adk.uninstall()
        await _run(_weather_agent(model), "the weather in Quito?", stream=False)
    assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == [
        "override",
        "override",
        None,
        None,
    ]


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(
        ConfigurationError, match=r"google-adk 1\.0\.0 .*supported: google-adk >=2\.15"
    ):
        tito_agents_google_adk.check_adk_version("1.0.0")
