"""Agent attribution with the real openai-agents release against the fake vLLM: handoffs, agents as
tools, tracing on and off, streamed and sync runs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tito_agents_openai_agents as tito_oa
from agents import RunConfig, Runner
from oa_script import CALLS_PER_RUN, build_agents, misattributed

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.smollm2 import MODEL_NAME

TRACING = pytest.mark.parametrize("tracing", ["on", "off"])


def run_config_for(capture: tito_oa.AgentsCapture, tracing: str) -> RunConfig | None:
    """Tracing on: no run config at all (the span map names agents). Off: the tito run config."""
    if tracing == "on":
        return None
    return capture.run_config(RunConfig(tracing_disabled=True))


def agents_of(episode: tito.Episode) -> list[str | None]:
    return [c.agent for c in sorted(episode.calls, key=lambda c: c.seq)]


@TRACING
async def test_handoff_calls_carry_the_agent_that_made_them(
    capture: tito_oa.AgentsCapture, tracing: str
) -> None:
    """After a handoff, the triage call is labelled triage and both specialist calls billing."""
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode(task_id="t") as ep:
        result = await Runner.run(
            agents.triage, "case-1: about my invoice", run_config=run_config_for(capture, tracing)
        )
        ep.set_reward(1.0)
    assert result.final_output == "[billing] case-1: your invoice is paid."
    assert agents_of(ep) == ["triage", "billing", "billing"]
    assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
    assert [p for c in ep.calls for p in misattributed(c, "case-1")] == []
    samples = captured_samples(capture.collector)
    assert [s.agent for s in samples] == ["triage", "billing", "billing"]
    assert all(s.reward == 1.0 and s.num_trained > 0 for s in samples)
    if tracing == "on":
        assert {c.labels["agent_path"] for c in ep.calls} == {"triage", "billing"}
        assert len({c.labels["agents_trace_id"] for c in ep.calls}) == 1


@TRACING
async def test_agent_run_as_tool_is_labelled_inside_its_caller(
    capture: tito_oa.AgentsCapture, tracing: str
) -> None:
    """The nested translator run's call is labelled translator, the manager's calls manager."""
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode() as ep:
        result = await Runner.run(
            agents.manager, "case-2: greet", run_config=run_config_for(capture, tracing)
        )
    assert result.final_output == "[manager] case-2: translated."
    assert agents_of(ep) == ["manager", "translator", "manager"]
    assert [p for c in ep.calls for p in misattributed(c, "case-2")] == []
    if tracing == "on":
        assert [c.labels["agent_path"] for c in sorted(ep.calls, key=lambda c: c.seq)] == [
            "manager",
            "manager>translator",
            "manager",
        ]


@TRACING
async def test_streamed_run_keeps_ids_and_labels(
    capture: tito_oa.AgentsCapture, tracing: str
) -> None:
    """A streamed run captures the same prompt and sampled ids as the same run not streamed."""
    agents = build_agents(MODEL_NAME)
    config = run_config_for(capture, tracing)
    async with capture.collector.episode() as plain:
        await Runner.run(agents.triage, "case-3: my invoice", run_config=config)
    async with capture.collector.episode() as streamed:
        result = Runner.run_streamed(agents.triage, "case-3: my invoice", run_config=config)
        events = [event async for event in result.stream_events()]
    assert events and result.final_output == "[billing] case-3: your invoice is paid."
    assert agents_of(streamed) == ["triage", "billing", "billing"]
    assert all(c.stream and c.status is tito.CallStatus.COMPLETE for c in streamed.calls)

    def ids(ep: tito.Episode) -> list[tuple[list[int], list[int]]]:
        ordered = sorted(ep.calls, key=lambda c: c.seq)
        return [(c.prompt_ids.tolist(), c.sampled_ids.tolist()) for c in ordered]

    assert ids(streamed) == ids(plain)
    assert all(sampled for _, sampled in ids(streamed))


@TRACING
def test_run_sync_is_captured_in_a_sync_episode(
    agents_server: Any, tracing: str, sdk_defaults: None
) -> None:
    """`Runner.run_sync` inside `with collector.episode()` labels its calls like `Runner.run`."""
    from oa_script import new_client

    collector = tito.Collector()
    client = new_client(agents_server)
    capture = tito_oa.install(collector, client, export_traces=False)
    agents = build_agents(MODEL_NAME)
    # run_sync reuses the thread's default loop and shuts its async generators down after each
    # run, so a second run_sync on one loop warns (an SDK quirk); give each test its own loop.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        with collector.episode() as ep:
            result = Runner.run_sync(
                agents.triage, "case-4: the weather", run_config=run_config_for(capture, tracing)
            )
        loop.run_until_complete(client.close())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert result.final_output == "[weather] case-4: it is sunny."
    assert agents_of(ep) == ["triage", "weather", "weather"]
    assert [p for c in ep.calls for p in misattributed(c, "case-4")] == []
    assert len(captured_samples(collector)) == CALLS_PER_RUN
    collector.close()


async def test_tracing_off_with_a_plain_run_config_is_labelled_by_the_installed_runner(
    capture: tito_oa.AgentsCapture,
) -> None:
    """With tracing off and the user's own `RunConfig` (no tito run config), the runner `install`
    made the SDK's default still adds the label filter: every call carries its agent."""
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode() as ep:
        await Runner.run(
            agents.triage, "case-5: invoice", run_config=RunConfig(tracing_disabled=True)
        )
    assert agents_of(ep) == ["triage", "billing", "billing"]
    assert [p for c in ep.calls for p in misattributed(c, "case-5")] == []


async def test_tracing_off_without_the_installed_runner_captures_without_agent(
    capture: tito_oa.AgentsCapture,
) -> None:
    """Without tito's runner (another default runner, or `set_default=False`) and tracing off,
    calls are still captured; only the agent is unknown (why `capture.run_config()` exists)."""
    from agents.run import AgentRunner, set_default_agent_runner

    set_default_agent_runner(AgentRunner())  # restored by the sdk_defaults fixture
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode() as ep:
        await Runner.run(
            agents.triage, "case-5: invoice", run_config=RunConfig(tracing_disabled=True)
        )
    assert len(ep.calls) == CALLS_PER_RUN
    assert agents_of(ep) == [None, None, None]


async def test_explicit_agent_scope_wins_over_the_sdk_labels(
    capture: tito_oa.AgentsCapture,
) -> None:
    """A user's own `tito_agents.agent(...)` scope overrides the labels the integration finds."""
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode() as ep:
        with tito.agent("policy"):
            await Runner.run(agents.triage, "case-6: invoice")
    assert agents_of(ep) == ["policy", "policy", "policy"]


async def test_span_map_is_empty_after_runs(capture: tito_oa.AgentsCapture) -> None:
    """The span map keeps only open spans: after runs (plain, streamed, nested) it is empty."""
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode():
        await Runner.run(agents.triage, "case-7: invoice")
        await Runner.run(agents.manager, "case-7: greet")
        result = Runner.run_streamed(agents.triage, "case-7: weather")
        async for _ in result.stream_events():
            pass
    assert capture.processor.open_spans == 0


async def test_missing_processor_is_reported_not_guessed(
    capture: tito_oa.AgentsCapture,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If the user replaces the SDK's processors without tito's, calls are still captured and
    labelled by the installed runner's filter (no `agent_path`: that needs the spans), and a
    warning says how to fix it."""
    from agents.tracing import set_trace_processors
    from tito_agents_openai_agents import _attribution

    monkeypatch.setattr(_attribution, "_warned_untracked", False)
    set_trace_processors([])
    try:
        async with capture.collector.episode() as ep:
            await Runner.run(build_agents(MODEL_NAME).triage, "case-8: invoice")
    finally:
        set_trace_processors([capture.processor])
    assert agents_of(ep) == ["triage", "billing", "billing"]
    assert all("agent_path" not in c.labels for c in ep.calls)
    assert "include capture.processor" in caplog.text
