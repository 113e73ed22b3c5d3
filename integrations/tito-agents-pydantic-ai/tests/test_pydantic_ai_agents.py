"""PydanticAI agents against the fake vLLM: a coordinator whose tool delegates to a researcher
agent, run in concurrent episodes, streamed or not. Every request the server answered is a
captured call of the right episode, labelled with the agent that made it."""

from __future__ import annotations

import asyncio
import logging

import openai
import pytest
import tito_agents_pydantic_ai
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


def _client(server: FakeVLLMServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key="x")


def _model(client: openai.AsyncOpenAI) -> OpenAIChatModel:
    return OpenAIChatModel(MODEL_NAME, provider=OpenAIProvider(openai_client=client))


def _team(client: openai.AsyncOpenAI) -> Agent[None, str]:
    """A coordinator that delegates to a researcher agent inside its tool, both counted."""
    check = tito_agents_pydantic_ai.CaptureCheck()
    researcher = Agent(
        _model(client), name="researcher", instructions="Answer briefly.", capabilities=[check]
    )
    coordinator = Agent(
        _model(client), name="coordinator", instructions="Ask the researcher.", capabilities=[check]
    )

    @coordinator.tool
    async def ask_researcher(ctx: RunContext[None], question: str) -> str:
        """Ask the researcher agent a question."""
        result = await researcher.run(question, usage=ctx.usage)
        return result.output

    return coordinator


def _misattributed(calls: list[tito.Call]) -> list[tito.Call]:
    """Calls labelled with the wrong agent: only the coordinator is offered the tool."""
    return [c for c in calls if (c.agent == "coordinator") != bool(c.tools)]


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
async def test_a_delegation_in_8_concurrent_episodes_is_captured_per_agent(
    pai_server: FakeVLLMServer, stream: bool
) -> None:
    """Each episode: the coordinator's tool call, the researcher's answer inside it, the
    coordinator's answer; as many calls captured as the server answered, none misattributed."""
    async with _client(pai_server) as client, tito.Collector() as collector:
        collector.wrap(client)
        await _delegate_concurrently(collector, _team(client), pai_server, stream)


async def _delegate_concurrently(
    collector: tito.Collector, coordinator: Agent[None, str], server: FakeVLLMServer, stream: bool
) -> None:
    sent_before = server.stats[CHAT]

    async def rollout(city: str) -> tito.Episode:
        async with collector.episode(task_id=city) as ep:
            prompt = f"what is the weather in {city}"
            if stream:
                async with coordinator.run_stream(prompt) as run:
                    await run.get_output()
            else:
                await coordinator.run(prompt)
        return ep

    episodes = await asyncio.gather(*(rollout(city) for city in CITIES))
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == server.stats[CHAT] - sent_before  # calls captured = calls made
    assert _misattributed(calls) == []
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == [
            "coordinator",
            "researcher",
            "coordinator",
        ]
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(ep.task_id in str(c.messages) for c in ep.calls)  # the right episode
        assert ep.report.bypassed_calls == 0
    assert {s.agent for s in captured_samples(collector)} == {"coordinator", "researcher"}
    assert collector.stats.bypassed_calls == 0


async def test_an_inferred_name_and_an_explicit_scope(pai_server: FakeVLLMServer) -> None:
    """An agent given no name is labelled with the name PydanticAI infers (its variable); an
    explicit `tito_agents.agent(...)` scope wins over the resolver."""
    async with _client(pai_server) as client, tito.Collector() as collector:
        helper = Agent(_model(collector.wrap(client)))
        async with collector.episode() as ep:
            await helper.run("hello there")
            with tito.agent("override"):
                await helper.run("hello again")
    assert [c.agent for c in ep.calls] == ["helper", "override"]


async def test_a_model_on_an_unwrapped_client_is_reported_as_bypassed(
    pai_server: FakeVLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The researcher's model is built on a client capture never saw: its requests are counted
    as bypassed, and the episode names PydanticAI's fix; without CaptureCheck it could not."""
    check = tito_agents_pydantic_ai.CaptureCheck()
    async with (
        _client(pai_server) as wrapped,
        _client(pai_server) as plain,
        tito.Collector() as collector,
    ):
        collector.wrap(wrapped)
        solver = Agent(_model(plain), name="solver", capabilities=[check])
        with caplog.at_level(logging.WARNING, "tito_agents"):
            async with collector.episode("lost") as ep:
                await solver.run("what is the weather in Paris")
            async with collector.episode("half") as half:
                await Agent(_model(wrapped), name="wrapped", capabilities=[check]).run("hi there")
                await solver.run("what is the weather in Oslo")
    assert ep.report.empty_cause is EmptyEpisodeCause.BYPASSED_CAPTURE
    assert ep.report.bypassed_calls == 1
    assert len(half.calls) == 1 and half.report.bypassed_calls == 1
    assert collector.stats.bypassed_calls == 2
    assert "PydanticAI completed 1 model calls" in caplog.text
    assert "'half': 1 of the 2 model calls PydanticAI made" in caplog.text
    assert "docs/frameworks.md#pydanticai" in caplog.text


def test_install_refuses_a_release_without_the_run_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic_ai import _run_context

    monkeypatch.delattr(_run_context, "get_current_run_context")
    with pytest.raises(ConfigurationError, match="get_current_run_context"):
        tito_agents_pydantic_ai.install()
