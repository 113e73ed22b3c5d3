"""End-to-end capture of the Responses API (`POST /v1/responses`) against the real CPU vLLM 0.32
serving SmolLM2-135M-Instruct.

Each captured call holds the server's own ids: its prompt ids equal the server's /tokenize of the
same conversation in chat form (vLLM renders a Responses request through the chat template:
instructions as the system message, function_call items as assistant tool calls, their outputs as
tool messages), and re-scoring prompt + sampled ids with /v1/completions `prompt_logprobs`
reproduces the captured rollout logprobs of free calls (mean |Δ| within the bf16 noise bound of
tests/support/real_vllm.py). The caller's response is the one an unwrapped client gets: the fields
capture added are null.
"""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.real_vllm import ASK, INSTRUCTIONS, MEAN_TOL, RESPONSES_TOOL, TOOLS, tokenize
from tests.support.rescore_check import rescored_logprobs
from tito_agents.testing import captured_samples

pytestmark = pytest.mark.e2e

TOOL = RESPONSES_TOOL
CHAT_TOOL = TOOLS[0]  # the same tool in the chat shape


def check_rescored(base_url: str, model: str, call: tito.Call) -> float:
    """Mean |Δ| between the captured logprobs of a free call and the server's re-scoring of its
    prompt + sampled ids."""
    assert call.logprobs is not None and call.logprobs.shape == call.sampled_ids.shape
    ids = call.prompt_ids.tolist() + call.sampled_ids.tolist()
    again = rescored_logprobs(base_url, model, ids)[len(call.prompt_ids) :]
    mean = float(np.abs(again - call.logprobs.astype(np.float64)).mean())
    assert mean <= MEAN_TOL, mean
    return mean


def test_non_streaming_call_is_exact_and_the_caller_sees_no_ids(
    vllm_base_url: str, vllm_model: str
) -> None:
    collector = tito.Collector(capture_logprobs=True)
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    with client, collector.episode() as ep:
        response = client.responses.create(
            model=vllm_model,
            instructions=INSTRUCTIONS,
            input="Name three colours of the rainbow.",
            max_output_tokens=24,
            temperature=1.0,
        )
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE, call.error
    assert call.call_id == f"{response.id}/0" and not call.stream
    assert call.prompt_ids.tolist() == tokenize(
        vllm_base_url,
        [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": "Name three colours of the rainbow."},
        ],
    )
    assert response.usage is not None
    assert response.usage.output_tokens == call.num_sampled
    assert call.finish_reason == ("length" if response.status == "incomplete" else "stop")
    assert response.model_extra is not None and response.model_extra["input_messages"] is None
    assert response.output[0].content[0].logprobs is None  # type: ignore[union-attr]
    check_rescored(vllm_base_url, vllm_model, call)
    assert len(captured_samples(collector)) == 1


@pytest.mark.parametrize("seed", [130, 131])
async def test_streaming_call_is_exact(vllm_base_url: str, vllm_model: str, seed: int) -> None:
    """The async client's `responses.stream`: ids from `response.completed`, the same text the
    caller assembled from the deltas, the same ids a non-streamed twin (same seed) samples. A
    stream's logprob entries are per text delta: when they cover every id they re-score; a stream
    that ends with EOS has none for it, so its call has no logprobs (seed 130 ends with EOS) and
    its twin's are re-scored instead."""
    collector = tito.Collector(capture_logprobs=True)
    client = collector.wrap(openai.AsyncOpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    args: dict[str, Any] = {
        "model": vllm_model,
        "input": "Say hello to Ada.",
        "max_output_tokens": 20,
        "temperature": 1.0,
        "extra_body": {"seed": seed},
    }
    async with collector.episode() as ep:
        async with client.responses.stream(**args) as events:
            async for _ in events:
                pass
            final = await events.get_final_response()
        await client.responses.create(**args)
    await client.close()
    call, twin = ep.calls
    assert call.status is tito.CallStatus.COMPLETE, call.error
    assert call.stream and call.call_id == f"{final.id}/0"
    assert call.prompt_ids.tolist() == tokenize(
        vllm_base_url, [{"role": "user", "content": "Say hello to Ada."}]
    )
    root = vllm_base_url.removesuffix("/v1")
    text = httpx.post(
        f"{root}/detokenize", json={"tokens": call.sampled_ids.tolist()}, timeout=60
    ).json()["prompt"]
    assert text.removesuffix("<|im_end|>") == final.output_text
    assert twin.sampled_ids.tolist() == call.sampled_ids.tolist()
    check_rescored(vllm_base_url, vllm_model, twin)
    if call.logprobs is not None:
        check_rescored(vllm_base_url, vllm_model, call)
    else:
        assert call.finish_reason == "stop" and call.sampled_ids[-1] == 2  # ended with EOS
    if seed == 130:
        assert call.logprobs is None


def test_tool_call_and_multi_turn_with_the_full_input_list(
    vllm_base_url: str, vllm_model: str
) -> None:
    """Turn 1 forces a function call (structured: `Call.tool_calls`; no logprobs: vLLM gives
    none for tokens that became a call); turn 2 passes the whole input list back with the
    function_call item and its output; both prompts are the server's rendering; every sampled
    token is trained exactly once in the merged samples."""
    collector = tito.Collector(capture_logprobs=True, assembly="merged")
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    items: list[Any] = [{"role": "user", "content": ASK}]
    with client, collector.episode() as ep:
        first = client.responses.create(
            model=vllm_model,
            instructions=INSTRUCTIONS,
            input=items,
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="required",
            max_output_tokens=60,
            temperature=1.0,
        )
        calls = [i for i in first.output if i.type == "function_call"]
        assert calls, first.output
        items += [
            {
                "type": "function_call",
                "call_id": c.call_id,
                "name": c.name,
                "arguments": c.arguments,
            }
            for c in calls
        ]
        items += [
            {"type": "function_call_output", "call_id": c.call_id, "output": "18C, sunny"}
            for c in calls
        ]
        second = client.responses.create(
            model=vllm_model,
            instructions=INSTRUCTIONS,
            input=items,
            tools=[TOOL],  # type: ignore[list-item]
            max_output_tokens=32,
            temperature=1.0,
        )
        ep.set_reward(1.0)
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE] * 2
    one, two = ep.calls
    assert one.constrained == "tool_choice=required" and one.logprobs is None
    assert one.tool_calls == [
        {"call_id": c.call_id, "name": c.name, "arguments": c.arguments, "id": c.id} for c in calls
    ]
    system = {"role": "system", "content": INSTRUCTIONS}
    assert one.prompt_ids.tolist() == tokenize(
        vllm_base_url, [system, {"role": "user", "content": ASK}], [CHAT_TOOL]
    )
    chat_turn = [
        system,
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ],
        },
        *({"role": "tool", "tool_call_id": c.call_id, "content": "18C, sunny"} for c in calls),
    ]
    assert two.prompt_ids.tolist() == tokenize(vllm_base_url, chat_turn, [CHAT_TOOL])
    if not two.tool_calls:  # a free text answer: its logprobs are the policy's own
        check_rescored(vllm_base_url, vllm_model, two)
    assert second.id in two.call_id
    samples = captured_samples(collector)
    trained = sum(int(s.loss_mask.sum()) for s in samples)
    assert trained == one.num_sampled + two.num_sampled, samples


def test_previous_response_id_is_refused_by_default_vllm(
    vllm_base_url: str, vllm_model: str
) -> None:
    """vLLM 0.32 stores no responses unless started with VLLM_ENABLE_RESPONSES_API_STORE=1:
    `previous_response_id` is a 404 the caller gets as the SDK's NotFoundError; no call."""
    collector = tito.Collector()
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    with client, collector.episode() as ep:
        first = client.responses.create(
            model=vllm_model, input="Hi", max_output_tokens=4, store=True
        )
        with pytest.raises(openai.NotFoundError):
            client.responses.create(
                model=vllm_model, input="Again", previous_response_id=first.id, max_output_tokens=4
            )
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE]
    assert collector.stats.failed_attempts == 1


def test_a_stream_without_logprobs_is_rescored(vllm_base_url: str, vllm_model: str) -> None:
    """vLLM 0.32 streams Responses logprobs per text delta, none for the EOS: a streamed answer
    that stops has exact ids and no logprobs. With re-scoring on it gets the policy's own, flagged
    `rescored`, and they match the rollout logprobs of the same greedy answer unstreamed."""
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True)
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
    ask: dict[str, Any] = dict(
        model=vllm_model,
        instructions=INSTRUCTIONS,
        input="Say hello in three words.",
        max_output_tokens=48,
        temperature=0.0,
    )
    with client, collector.episode() as ep:
        client.responses.create(**ask)
        with client.responses.stream(**ask) as events:
            events.get_final_response()
    plain, streamed = sorted(ep.calls, key=lambda c: c.seq)
    assert streamed.finish_reason == "stop", streamed.finish_reason  # ended on EOS
    assert np.array_equal(plain.sampled_ids, streamed.sampled_ids)  # greedy: the same answer
    assert plain.logprobs is not None and plain.policy_logprobs is None  # not re-scored
    assert streamed.logprobs is None and streamed.policy_logprobs is not None
    assert streamed.rescore_error is None
    mean = float(np.abs(streamed.policy_logprobs - plain.logprobs).mean())
    assert mean <= MEAN_TOL, mean
    samples = {s.call_ids[0]: s for s in captured_samples(collector)}
    assert samples[streamed.call_id].spans[0].logprob_source == "rescored"
    assert samples[plain.call_id].spans[0].logprob_source == "policy"
    assert collector.stats.rescored_calls == 1
    print(f"\nre-scored stream of {streamed.num_sampled} ids: mean |Δ| {mean:.4f}")
