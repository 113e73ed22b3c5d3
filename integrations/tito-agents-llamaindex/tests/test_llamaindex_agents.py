"""LlamaIndex agents against the fake vLLM: the quickstart `FunctionAgent` and an
`AgentWorkflow` whose coordinator hands off to a researcher, in 8 concurrent episodes, streamed
(LlamaIndex's default) or not. Every request the server answered is a captured call of the right
episode, labelled with the agent that made it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import openai
import pytest

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

pytest.importorskip(
    "llama_index.llms.openai_like",
    reason="llama-index-llms-openai-like is not installed here (llama-index-llms-openai pins "
    "openai < 3): these tests run in their own environment, make test-apart",
)

import tito_agents_llamaindex
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.llms.openai_like import OpenAILike

# llama-index-core 0.14 reads attributes pydantic deprecates (`__fields__`, instance
# `model_computed_fields`) in its own code
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


def _handing_off(view: RequestView) -> str:
    """The fake model as an agent offered LlamaIndex's `handoff` tool: it hands the user's
    message to the researcher once, and otherwise says what the default responder says."""
    tools = {(t.get("function") or {}).get("name") for t in view.tools}
    if "handoff" in tools and not any(m.get("role") == "tool" for m in view.messages):
        task = next(str(m["content"]) for m in view.messages if m.get("role") == "user")
        return hermes_tool_call("handoff", {"to_agent": "researcher", "reason": task})
    return default_responder(view)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=_handing_off)) as fake:
        yield fake


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return f"It is sunny in {city}."


@contextlib.asynccontextmanager
async def _llm(
    server: FakeVLLMServer, collector: tito.Collector, wrapped: bool = True
) -> AsyncIterator[OpenAILike]:
    """The documented line: LlamaIndex's OpenAI-like LLM on wrapped openai clients."""
    url = server.base_url

    def wrap(client: Any) -> Any:
        return collector.wrap(client) if wrapped else client

    with openai.OpenAI(base_url=url, api_key="x") as client:
        async with openai.AsyncOpenAI(base_url=url, api_key="x") as async_client:
            yield OpenAILike(
                model=MODEL_NAME,
                api_base=url,
                api_key="x",
                is_chat_model=True,
                is_function_calling_model=True,
                openai_client=wrap(client),
                async_openai_client=wrap(async_client),
            )


def _forecaster(llm: OpenAILike, stream: bool = True) -> Any:
    """LlamaIndex's quickstart agent: one tool."""
    return FunctionAgent(llm=llm, name="forecaster", tools=[get_weather], streaming=stream)


def _workflow(llm: OpenAILike, stream: bool = True) -> Any:
    """A coordinator that hands off to a researcher (LlamaIndex's multi-agent workflow)."""
    coordinator = FunctionAgent(
        llm=llm,
        name="coordinator",
        description="Routes questions.",
        can_handoff_to=["researcher"],
        streaming=stream,
    )
    researcher = FunctionAgent(
        llm=llm, name="researcher", description="Answers questions.", streaming=stream
    )
    return AgentWorkflow(agents=[coordinator, researcher], root_agent="coordinator")


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [
        (_forecaster, ["forecaster", "forecaster"]),
        (_workflow, ["coordinator", "researcher"]),
    ],
    ids=["quickstart", "handoff"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    server: FakeVLLMServer, make: Callable[[Any, bool], Any], agents: list[str], stream: bool
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the agent that made it, every sample with ids."""
    sent_before = server.stats[CHAT]
    async with tito.Collector() as collector, _llm(server, collector) as llm:
        runner = make(llm, stream)

        async def rollout(city: str) -> tito.Episode:
            async with collector.episode(task_id=city) as ep:
                await runner.run(user_msg=f"what is the weather in {city}")
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
    """The LLM's own clients: the episode ends empty and says no capturing client was used."""
    async with (
        tito.Collector() as collector,
        _llm(server, collector, wrapped=False) as llm,
        collector.episode() as ep,
    ):
        await _forecaster(llm).run(user_msg="what is the weather in Oslo")
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


async def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    server: FakeVLLMServer,
) -> None:
    async with tito.Collector() as collector, _llm(server, collector) as llm:
        agent = _forecaster(llm)
        async with collector.episode() as ep:
            with tito.agent("override"):
                await agent.run(user_msg="what is the weather in Lima")
            tito_agents_llamaindex.uninstall()
            await agent.run(user_msg="what is the weather in Quito")
    assert [c.agent for c in ep.calls] == ["override", "override", None, None]


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"llama-index-core 0\.12\.0 .*supported"):
        tito_agents_llamaindex.check_llama_index_version("0.12.0")
