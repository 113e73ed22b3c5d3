"""End-to-end capture against a real CPU vLLM serving SmolLM2-135M-Instruct.

Every captured call must hold exactly the ids the server returned; chat prompt ids must equal the
server's own /tokenize of the same messages and tools; and re-scoring each sample on the server must
reproduce the captured rollout logprobs of the trained tokens within bf16 noise.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.support.real_vllm import MAX_TOL, MEAN_TOL, TOOLS, tokenize
from tests.support.rescore_check import constrained, rescore_sample
from tito_agents.testing import captured_samples

pytestmark = pytest.mark.e2e

# bf16 noise measured on this server (docs/real-vllm.md): mean |Δ| ~ 0.03, max ~ 0.1.

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]


def check_samples(
    base_url: str, model: str, collector: tito.Collector, calls: list[tito.Call]
) -> int:
    """Re-score every sample (grammar-constrained calls left out); returns tokens checked."""
    samples = captured_samples(collector)
    assert samples
    skip = {c.call_id for c in calls if constrained(c)}
    checked = 0
    for sample in samples:
        result = rescore_sample(base_url, model, sample, skip)
        checked += result.tokens
        if result.tokens:
            assert result.mean_abs < MEAN_TOL and result.max_abs < MAX_TOL, result
    return checked


def test_sync_non_streaming_n2(vllm_base_url: str, vllm_model: str) -> None:
    """Sync client, n=2: one call per choice, ids equal to the response's, prompt = /tokenize.
    The caller asks for the ids itself here, so its response keeps them; without asking, it gets
    the response an unwrapped client gets (ids null) while the record holds them."""
    collector = tito.Collector(capture_logprobs=True)
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    with client, collector.episode() as ep:
        response = client.chat.completions.create(
            model=vllm_model,
            messages=MESSAGES,
            n=2,
            max_tokens=24,
            temperature=1.0,
            seed=7,
            extra_body={"return_token_ids": True},
        )
        unasked = client.chat.completions.create(
            model=vllm_model, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=8
        )
    assert unasked.prompt_token_ids is None  # type: ignore[attr-defined]
    assert unasked.choices[0].token_ids is None and unasked.choices[0].logprobs is None  # type: ignore[attr-defined]
    *asked, last = ep.calls
    assert last.status is tito.CallStatus.COMPLETE and last.sampled_ids.shape[0] > 0
    assert last.logprobs is not None
    assert len(asked) == 2
    for call in asked:
        assert call.status is tito.CallStatus.COMPLETE
        assert call.prompt_ids.tolist() == response.prompt_token_ids  # type: ignore[attr-defined]
        choice = response.choices[call.choice_index]
        assert call.sampled_ids.tolist() == choice.token_ids  # type: ignore[attr-defined]
    assert ep.calls[0].prompt_ids.tolist() == tokenize(vllm_base_url, MESSAGES)
    assert check_samples(vllm_base_url, vllm_model, collector, ep.calls)


async def test_async_streaming(vllm_base_url: str, vllm_model: str) -> None:
    """Async streaming: concatenated chunk ids equal the captured ids; re-scoring matches."""
    client = openai.AsyncOpenAI(base_url=vllm_base_url, api_key="EMPTY")
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    seen: list[int] = []
    prompt: list[int] = []
    async with collector.episode() as ep:
        stream = await client.chat.completions.create(
            model=vllm_model,
            messages=MESSAGES,
            max_tokens=24,
            temperature=1.0,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            extra = chunk.model_extra or {}
            prompt = extra.get("prompt_token_ids") or prompt
            for choice in chunk.choices:
                seen += (choice.model_extra or {}).get("token_ids") or []
    await client.close()
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE and call.stream
    assert call.sampled_ids.tolist() == seen
    assert call.prompt_ids.tolist() == prompt == tokenize(vllm_base_url, MESSAGES)
    assert check_samples(vllm_base_url, vllm_model, collector, ep.calls)


async def test_multi_turn_tool_loop(vllm_base_url: str, vllm_model: str) -> None:
    """A tool-calling loop (forced call, tool result, answer): every turn exact and re-scored."""
    client = openai.AsyncOpenAI(base_url=vllm_base_url, api_key="EMPTY")
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    async with collector.episode(task_id="weather") as ep:
        first = await client.chat.completions.create(
            model=vllm_model,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=128,
            temperature=1.0,
            seed=11,
        )
        msg = first.choices[0].message
        if msg.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": msg.content,
                    "tool_calls": [tc.model_dump() for tc in msg.tool_calls],
                }
            )
            for tc in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": tc.id, "content": "18C, sunny"})
        else:  # a 135M model may still produce an unparseable call: continue the dialogue
            messages.append({"role": "assistant", "content": msg.content or ""})
            messages.append({"role": "user", "content": "The tool says 18C and sunny."})
        second = await client.chat.completions.create(
            model=vllm_model,
            messages=messages,
            tools=TOOLS,
            max_tokens=32,
            temperature=1.0,
            seed=12,
            stream=True,
        )
        async for _ in second:
            pass
        ep.set_reward(1.0)
    await client.close()
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE] * 2
    assert ep.calls[0].prompt_ids.tolist() == tokenize(vllm_base_url, messages[:2], TOOLS)
    assert ep.calls[1].prompt_ids.tolist() == tokenize(vllm_base_url, messages, TOOLS)
    assert check_samples(vllm_base_url, vllm_model, collector, ep.calls)


def test_completions_with_token_prompt(vllm_base_url: str, vllm_model: str) -> None:
    """Completions with a token-id prompt: prompt ids echo the ids sent."""
    collector = tito.Collector(capture_logprobs=True)
    prompt = tokenize(vllm_base_url, MESSAGES)
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    with client, collector.episode() as ep:
        client.completions.create(model=vllm_model, prompt=prompt, max_tokens=16, temperature=1.0)
    (call,) = ep.calls
    assert call.prompt_ids.tolist() == prompt
    assert call.status is tito.CallStatus.COMPLETE
    assert check_samples(vllm_base_url, vllm_model, collector, ep.calls)
