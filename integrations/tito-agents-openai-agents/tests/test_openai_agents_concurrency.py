"""200 concurrent multi-agent runs over real HTTP never mix episodes or agents."""

from __future__ import annotations

import asyncio

import tito_agents_openai_agents as tito_oa
from agents import RunConfig, Runner
from oa_script import CALLS_PER_RUN, build_agents, misattributed

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.smollm2 import MODEL_NAME

RUNS = 200


async def test_200_concurrent_runs_have_zero_misattributed_calls(
    capture: tito_oa.AgentsCapture,
) -> None:
    """Concurrent runs mixing handoffs, agents as tools, streaming and tracing on/off: every call
    is in its own run's episode and labelled with the agent whose instructions it was sent with."""
    agents = build_agents(MODEL_NAME)
    traced = capture.run_config()
    untraced = capture.run_config(RunConfig(tracing_disabled=True))
    starts = [agents.triage, agents.triage, agents.manager]
    topics = ["invoice", "weather", "greeting"]

    async def one(i: int) -> tito.Episode:
        case = f"case-{i}"
        config = traced if i % 2 == 0 else untraced
        async with capture.collector.episode(case) as ep:
            start = starts[i % 3]
            text = f"{case}: about the {topics[i % 3]}"
            if i % 4 < 2:
                await Runner.run(start, text, run_config=config)
            else:
                result = Runner.run_streamed(start, text, run_config=config)
                async for _ in result.stream_events():
                    pass
            ep.set_reward(float(i))
        return ep

    episodes = await asyncio.gather(*(one(i) for i in range(RUNS)))

    problems = [
        p for i, ep in enumerate(episodes) for c in ep.calls for p in misattributed(c, f"case-{i}")
    ]
    assert problems == []
    assert [len(ep.calls) for ep in episodes] == [CALLS_PER_RUN] * RUNS
    expected_agents = [
        {"triage", "billing"},
        {"triage", "weather"},
        {"manager", "translator"},
    ]
    assert all(
        {c.agent for c in ep.calls} == expected_agents[i % 3] for i, ep in enumerate(episodes)
    )
    samples = captured_samples(capture.collector)
    assert len(samples) == RUNS * CALLS_PER_RUN
    assert all(s.reward == float(s.episode_id.removeprefix("case-")) for s in samples)
    assert capture.collector.stats.complete_calls == RUNS * CALLS_PER_RUN
    assert capture.processor.open_spans == 0
