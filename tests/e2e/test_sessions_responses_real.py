"""Token-in sessions for Responses API calls on the real CPU vLLM 0.32.

A multi-turn Responses conversation with a function tool in a `sessions=True` episode: the first
prompt is the server's render of the conversation (`/tokenize` of its chat form), every later call
is sent token-in (`kv_transfer_params.prompt_token_ids`, which `/v1/responses` honours: its
`input_messages` tokens are the ids sent) and starts with the previous prompt + sampled ids, and
merged assembly makes one sample whose trained tokens are exactly the sampled ids.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.real_vllm import ASK, INSTRUCTIONS, MAX_TOL, MEAN_TOL, TOOLS, tokenize
from tests.support.real_vllm import RESPONSES_TOOL as TOOL
from tests.support.rescore_check import rescore_sample
from tito_agents.testing import captured_samples
from tito_agents.testing.smollm2 import load_tokenizer

CHAT_TOOL = TOOLS[0]  # the same tool in the chat shape

pytestmark = pytest.mark.e2e


def responses_episode(client: openai.OpenAI, model: str) -> list[dict[str, Any]]:
    """Forced tool call, its output, an answer, a user turn, an answer: input only appended."""
    items: list[dict[str, Any]] = [{"role": "user", "content": ASK}]
    for turn in range(3):
        response = client.responses.create(
            model=model,
            instructions=INSTRUCTIONS,
            input=items,
            tools=[TOOL],
            tool_choice="required" if turn == 0 else "none",
            max_output_tokens=60 if turn == 0 else 16,
            temperature=1.0,
        )
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        for call in calls:
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": "18C, sunny"}
            )
        if not calls:
            items.append({"role": "user", "content": "Thanks! Say it again in five words."})
    return items


def test_responses_session_is_token_in_and_one_exact_sample(
    vllm_base_url: str, vllm_model: str
) -> None:
    collector = tito.Collector(
        capture_logprobs=True,
        rescore_constrained=True,
        assembly="merged",
        tokenizer=load_tokenizer(),
    )
    client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"), sessions=True)
    with client, collector.episode() as ep:
        responses_episode(client, vllm_model)
    calls = sorted(ep.calls, key=lambda c: c.seq)
    notes = [(c.session, c.session_reason) for c in calls]
    assert len(calls) == 3 and all(c.status is tito.CallStatus.COMPLETE for c in calls), notes
    assert calls[0].session == "first" and calls[0].tool_calls, calls[0].finish_reason
    # a turn cut by max_output_tokens is bridged with <|im_end|>: still token-in
    assert all(c.session in ("token_in", "token_in_bridged") for c in calls[1:]), notes
    # the first prompt is the server's own render of the conversation in chat form
    first = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": ASK}]
    assert calls[0].prompt_ids.tolist() == tokenize(vllm_base_url, first, [CHAT_TOOL])
    # each later prompt (the server's input_messages tokens: it used the ids sent) extends the
    # previous prompt + sampled ids
    for prev, nxt in itertools.pairwise(calls):
        head = np.concatenate((prev.prompt_ids, prev.sampled_ids))
        assert np.array_equal(nxt.prompt_ids[: head.shape[0]], head), nxt.session_reason
    # the tokens appended for the function_call_output are what the server's template renders
    # at the end of the conversation in chat form (its own conversion of the Responses items)
    (tool_call,) = calls[0].tool_calls or ()
    chat = [
        *first,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": tool_call["call_id"],
                    "type": "function",
                    "function": {"name": tool_call["name"], "arguments": tool_call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": tool_call["call_id"], "content": "18C, sunny"},
    ]
    delta = calls[1].prompt_ids[calls[0].prompt_ids.shape[0] + calls[0].sampled_ids.shape[0] :]
    rendered = tokenize(vllm_base_url, chat, [CHAT_TOOL])
    assert delta.shape[0] > 0 and rendered[-delta.shape[0] :] == delta.tolist()
    (sample,) = captured_samples(collector)
    assert ep.divergences == []
    assert np.array_equal(
        sample.token_ids, np.concatenate((calls[-1].prompt_ids, calls[-1].sampled_ids))
    )
    trained = np.concatenate([c.sampled_ids for c in calls])
    assert np.array_equal(sample.token_ids[sample.loss_mask.astype(bool)], trained)
    # the forced function call came back without logprobs (and masked): re-scored, so the one
    # sample has the policy's logprob on every trained token, as a re-scoring of it gives
    assert sample.spans[0].logprob_source == "rescored" and sample.policy_logprobs is not None
    again = rescore_sample(vllm_base_url, vllm_model, sample, policy=True)
    assert again.mean_abs < MEAN_TOL and again.max_abs < MAX_TOL, again
    print(
        f"\nresponses session: {[c.session for c in calls]}, "
        f"tool calls {[bool(c.tool_calls) for c in calls]}, sample of {sample.token_ids.shape[0]} "
        f"tokens, {int(sample.loss_mask.sum())} trained, re-scored policy logprobs mean |Δ| "
        f"{again.mean_abs:.4f}"
    )
