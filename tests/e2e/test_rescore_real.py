"""Constrained calls on the real CPU vLLM: flagged in every sample, and with re-scoring on, the
policy logprobs of every trained token match an independent re-scoring.

vLLM samples a forced tool choice through a grammar mask and reports the masked distribution's
logprobs (measured here: ~1 nat mean, up to ~17 nats from the free model's). With
`rescore_constrained=True` the collector re-scores those calls at the episode's end; this test
re-scores every trained token again, independently, and compares.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.real_vllm import MAX_TOL, MEAN_TOL, TOOLS
from tests.support.rescore_check import constrained, rescore_sample
from tito_agents.testing import captured_samples

pytestmark = pytest.mark.e2e


async def episode(
    client: openai.AsyncOpenAI, collector: tito.Collector, model: str, i: int
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"What is the weather in {['Paris', 'Oslo'][i % 2]}?"}
    ]
    async with collector.episode(task_id=f"t{i}") as ep:
        await client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=40,
            temperature=1.0,
            seed=i,
        )
        await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=24,
            temperature=1.0,
            seed=i,
            response_format={"type": "json_object"},
        )
        await client.chat.completions.create(
            model=model, messages=messages, max_tokens=24, temperature=1.0, seed=i
        )
    return ep


@pytest.mark.parametrize("assembly", ["per_call", "merged"])
def test_policy_logprobs_match_an_independent_rescoring(
    vllm_base_url: str, vllm_model: str, assembly: str
) -> None:
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True, assembly=assembly)
    client = collector.wrap(openai.AsyncOpenAI(base_url=vllm_base_url, api_key="EMPTY"))

    async def run() -> None:
        await asyncio.gather(*(episode(client, collector, vllm_model, i) for i in range(2)))
        await client.close()

    asyncio.run(run())
    samples = captured_samples(collector)
    stats = collector.stats
    assert stats.complete_calls == 6 and stats.constrained_calls == 4
    assert (stats.rescored_calls, stats.rescore_failures) == (4, 0)

    kinds = sorted({span.constrained or "free" for s in samples for span in s.spans})
    assert kinds == ["free", "response_format=json_object", "tool_choice=required"]
    gaps: list[float] = []
    for sample in samples:
        for span in sample.spans:
            assert span.logprob_source == ("rescored" if span.constrained else "policy")
        # every trained token, constrained spans included
        result = rescore_sample(vllm_base_url, vllm_model, sample, policy=True)
        assert result.mean_abs <= MEAN_TOL and result.max_abs <= MAX_TOL, (sample.spans, result)
        if sample.policy_logprobs is not None and sample.logprobs is not None:
            mask = sample.constrained_mask().astype(bool)
            gaps.extend(np.abs(sample.logprobs[mask] - sample.policy_logprobs[mask]).tolist())
    # the flag matters: the rollout logprobs of constrained tokens are not the policy's
    assert gaps and float(np.mean(gaps)) > 0.1


def test_flag_agrees_with_an_independent_reading_of_the_request(
    vllm_base_url: str, vllm_model: str
) -> None:
    collector = tito.Collector(capture_logprobs=True)  # re-scoring off: the spans say "masked"
    client = collector.wrap(openai.AsyncOpenAI(base_url=vllm_base_url, api_key="EMPTY"))

    async def run() -> tito.Episode:
        ep = await episode(client, collector, vllm_model, 0)
        await client.close()
        return ep

    calls = asyncio.run(run()).calls
    assert [constrained(c) for c in calls] == [c.constrained is not None for c in calls]
    assert sum(constrained(c) for c in calls) == 2
    for sample in captured_samples(collector):
        for span in sample.spans:
            assert span.logprob_source == ("masked" if span.constrained else "policy")
    assert all(s.policy_logprobs is None for s in captured_samples(collector))
