"""Runs multi-agent graphs concurrently and checks capture against LangGraph's own trace: each run
is streamed with `subgraphs=True`, and every `AIMessage` a model produced comes with the node that
produced it and, for agents, its `name` (`create_agent` and `create_react_agent` name their
messages); `attach_ids` put the captured call's id on it. Used by test_lc_multiagent.py (fake vLLM)
and tests/e2e/test_langgraph_multiagent.py (real vLLM)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from tito_agents_langchain import TitoCallbackHandler, call_id_of

import tito_agents as tito
from tito_agents.testing import captured_samples


@dataclass
class Traced:
    """What the framework reported for one run: the agent of each captured call, by call id."""

    episode_id: str
    history: set[str] = field(default_factory=set)
    """Call ids of earlier turns on the same thread: their messages come back in the state."""
    agents: dict[str, str] = field(default_factory=dict)
    uncaptured: int = 0


async def traced_run(
    app: CompiledStateGraph[Any], task: dict[str, Any], config: RunnableConfig, trace: Traced
) -> None:
    """Stream one run with its subgraphs; note the agent of every model-made message: its
    `name`, else (a plain graph) the node whose update carried it."""
    async for _namespace, update in app.astream(
        task, config=config, stream_mode="updates", subgraphs=True
    ):
        for node, delta in update.items():
            messages = delta.get("messages", []) if isinstance(delta, dict) else []
            for message in messages if isinstance(messages, list) else [messages]:
                if not isinstance(message, AIMessage) or _synthetic(message):
                    continue
                call_id = call_id_of(message)
                if call_id is None:
                    trace.uncaptured += 1
                elif call_id not in trace.history:
                    trace.agents[call_id] = message.name or node


def _synthetic(message: BaseMessage) -> bool:
    """Messages a handoff writes without any model call (langgraph-supervisor's transfer back)."""
    return bool(message.response_metadata.get("__is_handoff_back"))


@dataclass
class Outcome:
    """Every run's trace against its episode's calls, then the merged samples."""

    lost: int
    wrong_episode: int
    wrong_agent: int
    paths: dict[str, set[str]]
    merged: Counter[tuple[str, str | None]]
    calls: Counter[tuple[str, str | None]]
    starts: Counter[str]
    """`start_reason` of the merged samples: why an agent's trajectory was split."""


Runs = list[tuple[CompiledStateGraph[Any], list[tuple[dict[str, Any], RunnableConfig]]]]
"""(app, turns) per concurrent run; each turn (task, config) is one invocation, one episode."""


async def run_concurrently(
    collector: tito.Collector, runs: Runs, requests: Callable[[], int] | None = None
) -> Outcome:
    """Run each (app, turns) concurrently, one episode per turn, and compare with the trace.
    `requests`: the server's count of chat requests, when it keeps one (the fake's stats)."""
    handler = TitoCallbackHandler(collector, await_reward=True)
    requests_before = requests() if requests is not None else 0
    traces: list[Traced] = []

    async def one(app: CompiledStateGraph[Any], turns: list[Any]) -> None:
        seen: set[str] = set()
        for task, config in turns:
            trace = Traced(config["metadata"]["episode_id"], history=set(seen))
            traces.append(trace)
            await traced_run(app, task, {**config, "callbacks": [handler]}, trace)
            seen |= set(trace.agents)

    await asyncio.gather(*(one(app, turns) for app, turns in runs))
    episodes = {e.episode_id: e for e in handler.pending_episodes}
    sent = requests() - requests_before if requests is not None else None
    captured = [c for e in episodes.values() for c in e.calls]
    traced = sum(len(t.agents) + t.uncaptured for t in traces)
    wrong_episode = wrong_agent = 0
    paths: dict[str, set[str]] = {}
    calls: Counter[tuple[str, str | None]] = Counter()
    for trace in traces:
        own = {c.call_id: c for c in episodes[trace.episode_id].calls}
        wrong_episode += len(set(trace.agents) - set(own)) + len(set(own) - set(trace.agents))
        for call_id, agent in trace.agents.items():
            call = own.get(call_id)
            if call is None:
                continue
            wrong_agent += call.agent != agent
            paths.setdefault(agent, set()).add(str(call.labels.get("agent_path")))
            calls[(trace.episode_id, call.agent)] += 1
    assert handler.finish_pending() == len(traces)
    samples: list[tito.Sample] = captured_samples(collector)
    merged = Counter((s.episode_id, s.agent) for s in samples)
    starts = Counter(s.start_reason for s in samples)
    lost = abs(traced - len(captured)) + (abs(sent - len(captured)) if sent is not None else 0)
    lost += sum(t.uncaptured for t in traces)
    return Outcome(lost, wrong_episode, wrong_agent, paths, merged, calls, starts)
