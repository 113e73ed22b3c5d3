"""DSPy against the fake vLLM over HTTP: the quickstart `ChainOfThought` and a two-module
program, in 8 concurrent episodes, async or sync in threads, on the documented line
(`dspy.LM(..., engine="litellm", cache=False)` with LiteLLM's capture). Every request the server
answered is a captured call of the right episode, labelled with the module that made it; a group
of identical prompts reaches the server as a group."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy
import pytest
import tito_agents_dspy

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import ConfigurationError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

CHAT = "/v1/chat/completions"
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Quito", "Dakar", "Hanoi")


def _lm(server: FakeVLLMServer, **settings: Any) -> dspy.LM:
    """The documented line: DSPy's LiteLLM engine on vLLM's prefix, its response cache off."""
    options: dict[str, Any] = {"engine": "litellm", "cache": False, **settings}
    return dspy.LM(f"hosted_vllm/{MODEL_NAME}", api_base=server.base_url, api_key="x", **options)


class Researcher(dspy.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.take_notes = dspy.ChainOfThought("question -> notes")

    def forward(self, question: str) -> dspy.Prediction:
        return self.take_notes(question=question)

    async def aforward(self, question: str) -> dspy.Prediction:
        return await self.take_notes.acall(question=question)


class Writer(dspy.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.write = dspy.Predict("question, notes -> answer")

    def forward(self, question: str, notes: str) -> dspy.Prediction:
        return self.write(question=question, notes=notes)

    async def aforward(self, question: str, notes: str) -> dspy.Prediction:
        return await self.write.acall(question=question, notes=notes)


class Report(dspy.Module):  # type: ignore[misc]
    """Two agents: a researcher's notes, then a writer's answer from them."""

    def __init__(self) -> None:
        super().__init__()
        self.researcher = Researcher()
        self.writer = Writer()

    def forward(self, question: str) -> dspy.Prediction:
        notes = self.researcher(question=question).notes
        return self.writer(question=question, notes=notes)

    async def aforward(self, question: str) -> dspy.Prediction:
        notes = (await self.researcher.acall(question=question)).notes
        return await self.writer.acall(question=question, notes=notes)


def _quickstart() -> dspy.Module:
    """DSPy's first example: one ChainOfThought."""
    return dspy.ChainOfThought("question -> answer")


@pytest.fixture
def cache_in_memory() -> Iterator[None]:
    """DSPy's response cache in memory only (no disk cache left behind), put back after."""
    kept = dspy.cache
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    yield
    dspy.cache = kept


@pytest.mark.parametrize("threads", [False, True], ids=["acall", "threads"])
@pytest.mark.parametrize(
    ("make", "agents"),
    [(_quickstart, ["ChainOfThought"]), (Report, ["Researcher", "Writer"])],
    ids=["quickstart", "two-agents"],
)
async def test_8_concurrent_episodes_are_captured_per_agent(
    dspy_server: FakeVLLMServer,
    collector: tito.Collector,
    make: Callable[[], dspy.Module],
    agents: list[str],
    threads: bool,
) -> None:
    """As many calls captured as the server answered, each in its own episode, each named by
    the module that made it, every sample with ids."""
    lm = _lm(dspy_server)
    sent_before = dspy_server.stats[CHAT]

    async def rollout(city: str) -> tito.Episode:
        async with collector.episode(task_id=city) as ep:
            with dspy.context(lm=lm):
                await make().acall(question=f"{city}: what is the weather?")
        return ep

    def rollout_in_thread(city: str) -> tito.Episode:
        with collector.episode(task_id=city) as ep, dspy.context(lm=lm):
            make()(question=f"{city}: what is the weather?")
        return ep

    if threads:
        with ThreadPoolExecutor(len(CITIES)) as pool:
            episodes = list(pool.map(rollout_in_thread, CITIES))
    else:
        episodes = list(await asyncio.gather(*(rollout(city) for city in CITIES)))
    samples = captured_samples(collector)
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == dspy_server.stats[CHAT] - sent_before  # calls captured = calls made
    for ep in episodes:
        assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == agents
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert all(f"{ep.task_id}:" in str(c.messages) for c in ep.calls)  # the right episode
    assert {s.agent for s in samples} == set(agents)
    assert all(len(s.token_ids) and s.call_ids for s in samples)  # ids on each


async def test_a_group_of_identical_prompts_reaches_the_server_as_a_group(
    dspy_server: FakeVLLMServer, collector: tito.Collector, cache_in_memory: None
) -> None:
    """`cache=False` on the LM: 4 rollouts of one prompt are 4 requests, one in each episode,
    though DSPy's cache is on."""
    lm = _lm(dspy_server)
    question = f"{uuid.uuid4().hex}: what is the weather?"
    sent_before = dspy_server.stats[CHAT]
    episodes = []
    for _ in range(4):
        async with collector.episode(task_id="group") as ep:
            with dspy.context(lm=lm):
                await _quickstart().acall(question=question)
        episodes.append(ep)
    assert dspy_server.stats[CHAT] - sent_before == 4
    assert [len(ep.calls) for ep in episodes] == [1, 1, 1, 1]


async def test_with_its_cache_on_a_group_is_one_request_and_the_rest_say_why(
    dspy_server: FakeVLLMServer, collector: tito.Collector, cache_in_memory: None
) -> None:
    """DSPy's default (`cache=True`): the first rollout reaches the server, the others are
    answered from the cache and end empty, naming the cache."""
    lm = _lm(dspy_server, cache=True)
    question = f"{uuid.uuid4().hex}: what is the weather?"
    sent_before = dspy_server.stats[CHAT]
    episodes = []
    for _ in range(4):
        async with collector.episode(task_id="group") as ep:
            with dspy.context(lm=lm):
                await _quickstart().acall(question=question)
        episodes.append(ep)
    assert dspy_server.stats[CHAT] - sent_before == 1
    assert [len(ep.calls) for ep in episodes] == [1, 0, 0, 0]
    assert {ep.report.empty_cause for ep in episodes[1:]} == {EmptyEpisodeCause.RESPONSE_CACHE}


async def test_without_the_documented_line_nothing_is_captured(
    dspy_server: FakeVLLMServer, collector: tito.Collector
) -> None:
    """DSPy's default engine talks to the server over its own sockets: the request is answered,
    and the episode ends empty saying no capturing client was used."""
    lm = _lm(dspy_server, engine="auto")
    sent_before = dspy_server.stats[CHAT]
    async with collector.episode() as ep:
        with dspy.context(lm=lm):
            await _quickstart().acall(question="Lima: what is the weather?")
    assert dspy_server.stats[CHAT] - sent_before == 1
    assert ep.calls == []
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


async def test_an_explicit_scope_wins_and_uninstall_drops_the_names(
    dspy_server: FakeVLLMServer, collector: tito.Collector
) -> None:
    lm = _lm(dspy_server)
    async with collector.episode() as ep:
        with dspy.context(lm=lm):
            with tito.agent("override"):
                await _quickstart().acall(question="Quito: what is the weather?")
            tito_agents_dspy.uninstall()
            await _quickstart().acall(question="Dakar: what is the weather?")
    assert [c.agent for c in sorted(ep.calls, key=lambda c: c.seq)] == ["override", None]


def test_the_agent_is_the_innermost_own_module_else_the_outermost() -> None:
    report = Report()
    chain = report.researcher.take_notes
    assert tito_agents_dspy.agent_of([report, report.researcher, chain]) == "Researcher"
    assert tito_agents_dspy.agent_of([chain, chain.predict]) == "ChainOfThought"
    assert tito_agents_dspy.agent_of([]) is None


def test_an_unsupported_release_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"DSPy 3\.0\.0 .*supported: DSPy >=3\.4"):
        tito_agents_dspy.check_dspy_version("3.0.0")
