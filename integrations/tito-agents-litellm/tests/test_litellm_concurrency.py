"""Attribution under load and through LiteLLM's own machinery: 8 concurrent episodes on every
route, retries, sync calls in threads, and the Router."""

from __future__ import annotations

import asyncio
import itertools

import litellm
import pytest
import tito_agents_litellm
from litellm_support import PREFIXES, acomplete, call_kwargs, complete, marker_of

import tito_agents as tito
from tito_agents.calls import CallStatus
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

ROUTES = list(itertools.product(PREFIXES, (False, True)))
"""(prefix, stream): every route an episode's calls take."""


async def test_eight_concurrent_episodes_keep_their_calls(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
) -> None:
    """8 episodes at once, each making one call per route (4): calls captured = calls made, each
    in the episode that made it, and every sample has its ids."""

    async def episode(k: int) -> tito.Episode:
        async with collector.episode(f"ep-{k}") as ep:
            await asyncio.gather(*(acomplete(vllm, p, f"ep-{k}", stream=s) for p, s in ROUTES))
        return ep

    episodes = await asyncio.gather(*(episode(k) for k in range(8)))
    made = 8 * len(ROUTES)
    calls = [c for ep in episodes for c in ep.calls]
    assert len(calls) == made
    assert all(c.status is CallStatus.COMPLETE for c in calls)
    misattributed = [c for ep in episodes for c in ep.calls if marker_of(c) != ep.episode_id]
    assert misattributed == []
    samples = captured_samples(collector)
    assert len(samples) == made
    calls_by_id = {c.call_id: c for c in calls}
    for sample in samples:
        assert len(sample.token_ids) > 0
        assert sample.call_ids
        assert all(marker_of(calls_by_id[i]) == sample.episode_id for i in sample.call_ids)


async def test_sync_calls_in_threads_keep_their_episode(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
) -> None:
    """Tools and sync agents run `litellm.completion` in worker threads (`asyncio.to_thread`
    copies the context): each call still lands in its episode."""

    async def episode(k: int) -> tito.Episode:
        async with collector.episode(f"th-{k}") as ep:
            await asyncio.gather(
                *(asyncio.to_thread(complete, vllm, p, f"th-{k}", stream=s) for p, s in ROUTES)
            )
        return ep

    episodes = await asyncio.gather(*(episode(k) for k in range(4)))
    assert [len(ep.calls) for ep in episodes] == [len(ROUTES)] * 4
    assert all(marker_of(c) == ep.episode_id for ep in episodes for c in ep.calls)


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_retries_keep_attribution(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
    prefix: str,
) -> None:
    """A server that fails once (503): LiteLLM's `num_retries` (and, on `openai/`, the SDK's own
    retry) sends again; the answered call is captured once, in its episode, with its ids."""
    failed_before = vllm.stats.statuses[503]
    vllm.faults.status_before_body = 503
    vllm.faults.status_before_body_count = 1
    async with collector.episode("retried") as ep:
        response = await litellm.acompletion(
            **call_kwargs(vllm, prefix, "retried", num_retries=2, max_retries=0)
        )
    assert vllm.stats.statuses[503] == failed_before + 1  # the first attempt did fail
    assert response.choices[0].message.content
    complete_calls = [c for c in ep.calls if c.status is CallStatus.COMPLETE]
    assert len(complete_calls) == 1
    assert all(c.episode_id == "retried" for c in ep.calls)
    assert len(complete_calls[0].sampled_ids) > 0


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_router_calls_are_captured(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
    prefix: str,
) -> None:
    """`litellm.Router` builds and caches clients of its own per deployment; they are captured."""
    router = litellm.Router(
        model_list=[
            {
                "model_name": "policy",
                "litellm_params": {
                    "model": f"{prefix}/{MODEL_NAME}",
                    "api_base": vllm.base_url,
                    "api_key": "EMPTY",
                },
            }
        ]
    )
    async with collector.episode("routed") as ep:
        await router.acompletion(
            model="policy", messages=[{"role": "user", "content": "routed: hi"}], max_tokens=8
        )
        stream = await router.acompletion(
            model="policy",
            messages=[{"role": "user", "content": "routed: hi"}],
            max_tokens=8,
            stream=True,
        )
        async for _ in stream:
            pass
    assert [(c.stream, marker_of(c)) for c in ep.calls] == [(False, "routed"), (True, "routed")]
