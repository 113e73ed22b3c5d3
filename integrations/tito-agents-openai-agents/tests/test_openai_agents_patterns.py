"""The Agents SDK's multi-agent patterns (openai-agents-python's examples/agent_patterns: handoffs,
agents as tools, parallelization, streamed routing), written as upstream writes them, captured with
the one-line install: 8 concurrent runs of each, and every captured call is checked against the
SDK's own trace (0 calls lost, 0 in the wrong episode, 0 with the wrong agent)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
import tito_agents_openai_agents as tito_oa
from agents import ItemHelpers, Runner, TResponseInputItem, add_trace_processor, trace
from agents.tracing import set_trace_processors
from oa_script import (
    Agents,
    MoreAgents,
    build_agents,
    build_more_agents,
    case_of,
    misattributed,
)
from sdk_trace import SpanLog, call_key

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

RUNS = 8
EXPECTED = {
    "handoffs": [{"triage": 1, "billing": 2}, {"triage": 1, "weather": 2}],
    "agents_as_tools": [{"manager": 2, "translator": 1}],
    "parallelization": [{"spanish": 3, "picker": 1}],
    "streamed_routing": [{"router": 1, "french": 2}, {"router": 1, "english": 2}],
}
"""Calls per agent of one run (alternating variants by run index)."""


@pytest.fixture
async def one_line(agents_server: FakeVLLMServer, api: str) -> AsyncIterator[tito_oa.AgentsCapture]:
    """The documented one line, nothing else: no model, no client, no run config (and the API:
    the SDK's default Responses, or Chat Completions)."""
    collector = tito.Collector()
    if api == "responses":
        capture = tito_oa.install(collector, base_url=agents_server.base_url)
    else:
        capture = tito_oa.install(
            collector, base_url=agents_server.base_url, api="chat_completions"
        )
    yield capture
    await capture.aclose()
    collector.close()


async def run_pattern(
    pattern: str, i: int, tune: Callable[[Agents, MoreAgents], None] | None = None
) -> None:
    """One run of `pattern`, as the upstream example writes it (agents name no model); `tune`
    may set the agents' model settings first (the real-server test does)."""
    case = f"case-{i}"
    agents, more = build_agents(None), build_more_agents()  # type: ignore[arg-type]
    if tune is not None:
        tune(agents, more)
    if pattern == "handoffs":
        topic = "invoice" if i % 2 == 0 else "weather"
        await Runner.run(agents.triage, f"{case}: about the {topic}")
    elif pattern == "agents_as_tools":
        await Runner.run(agents.manager, f"{case}: greet the team")
    elif pattern == "parallelization":
        with trace("Parallel translation"):
            results = await asyncio.gather(
                *(Runner.run(more.spanish, f"{case}: Good morning!") for _ in range(3))
            )
            outputs = [ItemHelpers.text_message_outputs(r.new_items) for r in results]
            translations = "\n\n".join(outputs)
            await Runner.run(more.picker, f"{case}: Input\n\nTranslations:\n{translations}")
    else:
        greeting = "bonjour, how do I say good evening" if i % 2 == 0 else "hello there"
        inputs: list[TResponseInputItem] = [{"content": f"{case}: {greeting}", "role": "user"}]
        agent = more.router
        for _ in range(2):
            with trace("Routing example", group_id=case):
                result = Runner.run_streamed(agent, input=inputs)
                async for _event in result.stream_events():
                    pass
            inputs = result.to_input_list()
            inputs.append({"content": f"{case}: Thanks!", "role": "user"})
            agent = result.current_agent


@pytest.mark.parametrize("pattern", list(EXPECTED))
async def test_pattern_runs_match_the_sdk_trace(
    one_line: tito_oa.AgentsCapture, pattern: str, api: str
) -> None:
    """8 concurrent runs, one episode each: every model call the SDK traced was captured once, in
    its own run's episode, labelled with the agent the SDK's span tree names."""
    log = SpanLog()
    add_trace_processor(log)
    collector = one_line.collector
    uncaptured = one_line.stats.uncaptured_calls  # process-wide counter

    async def one(i: int) -> tito.Episode:
        async with collector.episode(f"case-{i}") as ep:
            await run_pattern(pattern, i)
        return ep

    try:
        episodes = await asyncio.gather(*(one(i) for i in range(RUNS)))
    finally:
        set_trace_processors([one_line.processor])
    traced = log.model_calls()
    variants = EXPECTED[pattern]
    for i, ep in enumerate(episodes):
        case = f"case-{i}"
        sdk = [t for t in traced if case_of(t.input) == case]
        assert Counter(c.agent for c in ep.calls) == variants[i % len(variants)]
        assert len(ep.calls) == len(sdk)  # nothing lost, nothing extra
        assert Counter((c.agent, call_key(c)) for c in ep.calls) == Counter(
            (t.agent, t.key) for t in sdk
        )
        assert [p for c in ep.calls for p in misattributed(c, case)] == []
        assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
        assert {c.model for c in ep.calls} == {MODEL_NAME}  # the served model, named by no agent
        assert {c.endpoint.value for c in ep.calls} == {
            "responses" if api == "responses" else "chat"
        }
    total = sum(len(ep.calls) for ep in episodes)
    assert len(traced) == total
    assert len(captured_samples(collector)) == total
    assert collector.stats.empty_episodes == 0
    assert one_line.stats.uncaptured_calls == uncaptured
    assert one_line.processor.open_spans == 0
