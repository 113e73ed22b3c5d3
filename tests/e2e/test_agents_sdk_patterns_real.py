"""End-to-end: the Agents SDK's multi-agent patterns on the real CPU vLLM, on the SDK's default
Responses model, captured with the one-line install (agents name no model).

Handoffs, agents as tools, parallelization and streamed routing, 8 concurrent runs of each (one
episode per run). The small model chooses freely (forced tool choice makes routers hand off) and
short answers keep the test lean (a cut answer ends the run: the SDK fails an incomplete response),
so the oracle is the SDK's own trace: every model call it traced as successful was captured once (its
response id is a captured call's), in the episode of its run, with the agent its span tree names.
A response the SDK itself failed (a small model cut by `max_output_tokens`) may still be a captured
call: those are the only captured calls without a successful span.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import pytest

import tito_agents as tito

pytest.importorskip("tito_agents_openai_agents", reason="needs tito-agents[openai-agents]")

import tito_agents_openai_agents as tito_oa
from agents import AgentsException, ModelSettings, add_trace_processor
from agents.tracing import set_trace_processors

_TESTS = (
    Path(__file__).resolve().parents[2] / "integrations" / "tito-agents-openai-agents" / "tests"
)
sys.path.insert(0, str(_TESTS))
from oa_script import Agents, MoreAgents, case_of  # noqa: E402
from sdk_trace import SpanLog  # noqa: E402
from test_openai_agents_patterns import run_pattern  # noqa: E402

pytestmark = pytest.mark.e2e

RUNS = 8
PATTERNS = ["handoffs", "agents_as_tools", "parallelization", "streamed_routing"]


def small_model_settings(agents: Agents, more: MoreAgents) -> None:
    """Routers must hand off or call their tool (forced tool choice; the SDK resets it after a
    tool call); every agent answers in a bounded number of tokens."""
    forced = ModelSettings(tool_choice="required", max_tokens=48, temperature=1.0)
    free = ModelSettings(max_tokens=48, temperature=1.0)
    for agent in (agents.billing, agents.weather, agents.translator, more.spanish, more.picker):
        agent.model_settings = free
    for agent in (agents.triage, agents.manager, more.router):
        agent.model_settings = forced
    for target in more.router.handoffs:
        target.model_settings = free  # type: ignore[union-attr]


async def test_patterns_on_the_real_server_match_the_sdk_trace(vllm_base_url: str) -> None:
    """8 concurrent runs of each pattern: 0 traced calls lost, 0 in the wrong episode, 0 with
    the wrong agent; every captured call has the server's ids."""
    collector = tito.Collector()
    capture = tito_oa.install(collector, base_url=vllm_base_url)  # the one line
    log = SpanLog()
    add_trace_processor(log)

    async def one(pattern: str, i: int) -> tito.Episode:
        async with collector.episode(f"{pattern}-case-{i}") as ep:
            try:
                await run_pattern(pattern, i, small_model_settings)
            except AgentsException:  # a 135M model can loop or be cut; its calls still count
                ep.metadata["sdk_error"] = True
        return ep

    try:
        episodes = await asyncio.gather(*(one(p, i) for p in PATTERNS for i in range(RUNS)))
    finally:
        set_trace_processors([capture.processor])
        await capture.aclose()
    traced = {t.key: t for t in log.model_calls()}
    calls = [c for ep in episodes for c in ep.calls]
    by_id = {c.request_id: c for c in calls}
    assert len(by_id) == len(calls)  # one call per response
    assert [key for key in traced if key not in by_id] == []  # 0 lost
    assert [  # 0 wrong agent
        (key, t.agent, by_id[key].agent) for key, t in traced.items() if by_id[key].agent != t.agent
    ] == []
    traces_of: dict[str, set[str]] = {}
    for ep in episodes:
        case = "case-" + ep.episode_id.rpartition("-case-")[2]
        mine = [traced[c.request_id] for c in ep.calls if c.request_id in traced]
        assert {case_of(t.input) for t in mine} - {"case-?"} <= {case}, ep.episode_id
        traces_of[ep.episode_id] = {t.trace_id for t in mine}
    owners = Counter(trace for traces in traces_of.values() for trace in traces)
    assert [trace for trace, n in owners.items() if n > 1] == []  # 0 wrong episode
    unmatched = [c for c in calls if c.request_id not in traced]
    assert len(unmatched) <= log.failed_model_calls()  # responses the SDK itself failed
    for pattern in PATTERNS:  # every run made at least its first call
        ran = [c for ep in episodes if ep.episode_id.startswith(pattern) for c in ep.calls]
        assert len({c.episode_id for c in ran}) == RUNS, pattern
    assert all(c.endpoint.value == "responses" and len(c.sampled_ids) > 0 for c in calls)
    assert all(c.status is tito.CallStatus.COMPLETE for c in calls)
    agents = Counter(c.agent for c in calls)
    assert {"triage", "manager", "spanish", "router"} <= set(agents)
    assert collector.stats.empty_episodes == 0
    collector.close()
