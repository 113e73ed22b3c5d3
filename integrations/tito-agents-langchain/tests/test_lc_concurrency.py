"""Concurrent graph invocations sharing one handler never mix their calls (checked by content)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from lc_support import MakeModel, decode, react_graph
from tito_agents_langchain import TitoCallbackHandler, wrap

import tito_agents as tito
from tito_agents.testing import captured_samples

_QUESTION = re.compile(r"Question (\d+):")


def question(i: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"Question {i}: what is the weather in Paris?")]}


def index_of(outputs: Any) -> float:
    """The reward: the question number, read back from the run's own outputs."""
    match = _QUESTION.search(outputs["messages"][0].content)
    assert match is not None
    return float(match.group(1))


def misattributed(collector: tito.Collector, tokenizer: Any, episodes: int) -> int:
    """Samples whose prompt is not their own episode's question, or whose reward is not its own."""
    samples: list[tito.Sample] = captured_samples(collector)
    assert len(samples) == 2 * episodes  # agent -> tools -> agent: two model calls each
    wrong = 0
    for sample in samples:
        i = int(sample.episode_id.removeprefix("ep-"))
        prompt = decode(tokenizer, sample.token_ids[: sample.spans[0].start])
        own = _QUESTION.findall(prompt) == [str(i)]
        wrong += not (own and sample.reward == float(i) and sample.agent == "agent")
    return wrong


async def test_two_hundred_concurrent_graphs_never_mix(
    make_model: MakeModel, collector: tito.Collector, tokenizer: Any
) -> None:
    """200 graph invocations under asyncio.gather, one shared handler: every call lands in its own
    invocation's episode (its prompt holds its own question) with its own reward."""
    handler = TitoCallbackHandler(collector, reward_fn=index_of)
    graph = react_graph(wrap(make_model(), collector))

    async def rollout(i: int) -> None:
        config: RunnableConfig = {"callbacks": [handler], "metadata": {"episode_id": f"ep-{i}"}}
        await asyncio.sleep((i % 7) * 0.002)
        await graph.ainvoke(question(i), config=config)

    await asyncio.gather(*(rollout(i) for i in range(200)))
    assert misattributed(collector, tokenizer, 200) == 0
    assert collector.stats.episodes == 200 and collector.stats.duplicate_calls == 0


def test_sync_batch_of_graphs_on_threads_never_mix(
    make_model: MakeModel, collector: tito.Collector, tokenizer: Any
) -> None:
    """graph.batch() runs invocations on threads (sync nodes too): calls still never mix."""
    handler = TitoCallbackHandler(collector, reward_fn=index_of)
    graph = react_graph(wrap(make_model(), collector), sync_node=True)
    configs: list[RunnableConfig] = [
        {"callbacks": [handler], "metadata": {"episode_id": f"ep-{i}"}, "max_concurrency": 8}
        for i in range(24)
    ]
    graph.batch([question(i) for i in range(24)], config=configs)
    assert misattributed(collector, tokenizer, 24) == 0
