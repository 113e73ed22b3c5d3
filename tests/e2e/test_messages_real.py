"""End-to-end capture of Anthropic's Messages API (`POST /v1/messages`) against the real CPU vLLM
0.32 serving SmolLM2-135M-Instruct, driven by the official `anthropic` SDK.

Capture sends each Messages call as vLLM's own chat conversion to `/v1/chat/completions` and
converts the answer back. Checked side by side with the server's own `/v1/messages` for the same
request (greedy, so both runs sample the same tokens): what the agent sees through capture equals
the direct answer (content blocks, tool_use, stop reason, usage; every stream event, in order);
each call's prompt ids equal `/v1/messages/render` of the same request (the ids of vLLM's own
rendering, `--enable-scale-out`); its sampled ids re-score within bf16 noise; vLLM's errors reach
the caller as vLLM answers them; through the gateway as in process; token-in sessions and merged
assembly work on Messages calls.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import numpy as np
import pytest

import tito_agents as tito
from tests.support.gateway_harness import ServedGateway
from tests.support.real_vllm import MEAN_TOL
from tests.support.rescore_check import rescored_logprobs
from tito_agents.calls import SessionNote
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0}
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Get the current weather in a given city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    }
]
STRICT_TOOLS: list[Any] = [
    {
        **TOOLS[0],
        "strict": True,
        "input_schema": {**TOOLS[0]["input_schema"], "additionalProperties": False},
    }
]
"""The tool, strict: a forced call's grammar follows the schema, so a 135M model closes it."""
ASK: list[Any] = [{"role": "user", "content": "What is the weather like in Paris?"}]
SYSTEM = "You are a helpful assistant. Use the tools you are given."
CASES: dict[str, dict[str, Any]] = {
    "text": {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24},
    "stop sequence": {
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 24,
        "stop_sequences": ["Blue", "Green"],
    },
    "tools offered": {"system": SYSTEM, "messages": ASK, "tools": TOOLS, "max_tokens": 48},
    "tool forced": {
        "system": SYSTEM,
        "messages": ASK,
        "tools": STRICT_TOOLS,
        "tool_choice": {"type": "any"},
        "max_tokens": 60,
    },
    "tool named": {
        "messages": ASK,
        "tools": STRICT_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "max_tokens": 60,
    },
    "inline system (probed)": {
        "system": SYSTEM,
        "messages": [
            {"role": "user", "content": "Name three colours."},
            {"role": "system", "content": "Answer in one line."},
        ],
        "max_tokens": 24,
    },
    "thinking disabled (probed)": {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "thinking": {"type": "disabled"},
        "max_tokens": 24,
    },
    "tool result": {
        "system": SYSTEM,
        "tools": TOOLS,
        "max_tokens": 32,
        "messages": [
            *ASK,
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}],
            },
        ],
    },
}


def root_of(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def ids_out(data: Any) -> Any:
    """`data` with every fresh id (the response's, a tool_use's) and thinking signature marked."""
    if isinstance(data, dict):
        return {k: "<fresh>" if k in ("id", "signature") else ids_out(v) for k, v in data.items()}
    if isinstance(data, list):
        return [ids_out(v) for v in data]
    return data


def render(base_url: str, request: dict[str, Any]) -> list[int]:
    """vLLM's own ids of a Messages request (`/v1/messages/render`)."""
    reply = httpx.post(f"{base_url}/messages/render", json=request, timeout=120)
    reply.raise_for_status()
    return list(reply.json()["token_ids"])


def both(
    base_url: str, model: str, case: dict[str, Any], *, stream: bool
) -> tuple[Any, Any, tito.Call]:
    """The same request through capture and straight to `/v1/messages`: (captured view, direct
    view, the call); a stream's view is its event list."""
    request = {"model": model, **case}
    collector = tito.Collector(capture_logprobs=True)
    captured = collector.wrap(anthropic.Anthropic(base_url=root_of(base_url), api_key="EMPTY"))
    direct = anthropic.Anthropic(base_url=root_of(base_url), api_key="EMPTY")
    with captured, direct, collector.episode() as ep:
        views = []
        for client in (captured, direct):
            if stream:  # the raw events, as the server sent them
                events = client.messages.create(**request, stream=True, extra_body=GREEDY)
                views.append([ids_out(event.model_dump()) for event in events])
            else:
                reply = client.messages.create(**request, extra_body=GREEDY)
                views.append(ids_out(reply.model_dump()))
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE, call.error
    assert call.translated_from == "messages" and call.stream is stream
    assert call.prompt_ids.tolist() == render(base_url, {**request, **GREEDY})
    return views[0], views[1], call


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
def test_the_caller_sees_what_vllms_own_messages_endpoint_answers(
    vllm_scale_out_url: str, vllm_model: str, name: str, stream: bool
) -> None:
    seen, direct, call = both(vllm_scale_out_url, vllm_model, CASES[name], stream=stream)
    assert seen == direct
    if not stream:
        assert seen["usage"]["input_tokens"] == call.prompt_ids.size
        assert seen["usage"]["output_tokens"] == call.sampled_ids.size
    else:
        names = [event["type"] for event in seen]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    if name == "stop sequence":
        assert (seen if not stream else seen[-2]["delta"])["stop_sequence"] == "Blue"
    if name.startswith("tool ") and name != "tool result":
        blocks = (
            seen["content"]
            if not stream
            else [e["content_block"] for e in seen if e["type"] == "content_block_start"]
        )
        assert [b["type"] for b in blocks] == ["tool_use"] and blocks[0]["name"] == "get_weather"
        assert call.tool_calls is not None and call.tool_calls[0]["name"] == "get_weather"
    assert call.logprobs is not None
    if call.constrained is not None:  # logprobs of the grammar-masked distribution
        return
    ids = call.prompt_ids.tolist() + call.sampled_ids.tolist()
    again = rescored_logprobs(vllm_scale_out_url, vllm_model, ids)[call.prompt_ids.size :]
    assert float(np.abs(again - call.logprobs.astype(np.float64)).mean()) <= MEAN_TOL


def test_vllms_refusals_reach_the_caller_as_vllm_answers_them(
    vllm_base_url: str, vllm_model: str
) -> None:
    """Missing max_tokens, a bad role, an unsupported block, a prompt over the context: the
    caller gets vLLM's own status and body; none is a call."""
    bad: list[dict[str, Any]] = [
        {"model": vllm_model, "messages": ASK},
        {"model": vllm_model, "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
        {
            "model": vllm_model,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
        },
        {
            "model": vllm_model,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "word " * 9000}],
        },
    ]
    collector = tito.Collector()
    captured = collector.wrap(anthropic.Anthropic(base_url=root_of(vllm_base_url), api_key="x"))
    http = captured._client  # the SDK's own HTTP client, capture installed: raw status and body
    with captured, collector.episode() as ep:
        for body in bad:
            direct = httpx.post(f"{vllm_base_url}/messages", json=body, timeout=120)
            assert direct.status_code >= 400
            seen = http.post(f"{vllm_base_url}/messages", json=body, timeout=120)
            assert (seen.status_code, seen.json()) == (direct.status_code, direct.json())
    assert ep.calls == []


def test_the_anthropic_sdk_through_the_gateway_gives_exact_samples(
    vllm_scale_out_url: str, vllm_model: str
) -> None:
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, vllm_scale_out_url) as gateway:
        opened = gateway.control().open("ep-messages")
        client = anthropic.Anthropic(
            base_url=gateway.url + opened["base_url"].removesuffix("/v1"), api_key="EMPTY"
        )
        request = {"model": vllm_model, **CASES["tool forced"]}
        with client:
            body = client.messages.create(**request, extra_body=GREEDY)
            with client.messages.stream(**request, extra_body=GREEDY) as stream:
                final = stream.get_final_message()
            counted = client.messages.count_tokens(
                model=vllm_model, messages=ASK, system=SYSTEM, tools=STRICT_TOOLS
            )
        gateway.control().close("ep-messages")
    assert ids_out(body.model_dump()) == ids_out(final.model_dump())
    assert body.stop_reason == "tool_use" and body.content[0].type == "tool_use"
    samples = captured_samples(collector)
    assert len(samples) == 2
    prompt = render(vllm_scale_out_url, {**request, **GREEDY})
    for sample in samples:
        assert sample.token_ids[: len(prompt)].tolist() == prompt
    assert counted.input_tokens == len(prompt)
    collector.close()


def test_token_in_sessions_and_merged_assembly_on_messages_calls(
    vllm_base_url: str, vllm_model: str
) -> None:
    """An append-only Messages conversation with sessions: the second call is sent as tokens and
    the episode merges into one exact sample."""
    from tito_agents.testing.smollm2 import load_tokenizer

    collector = tito.Collector(assembly="merged", tokenizer=load_tokenizer())
    client = collector.wrap(
        anthropic.Anthropic(base_url=root_of(vllm_base_url), api_key="EMPTY"), sessions=True
    )
    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
    with client, collector.episode() as ep:
        for follow_up in ("Another one?", "And a third?"):
            reply = client.messages.create(
                model=vllm_model, max_tokens=24, messages=messages, extra_body=GREEDY
            )
            messages.append({"role": "assistant", "content": reply.content[0].text})  # type: ignore[union-attr]
            messages.append({"role": "user", "content": follow_up})
    first, *later = sorted(ep.calls, key=lambda c: c.seq)
    assert first.session == SessionNote.FIRST
    for call in later:
        assert call.session in (SessionNote.TOKEN_IN, SessionNote.TOKEN_IN_BRIDGED), (
            call.session_reason
        )
    (sample,) = captured_samples(collector)
    last = later[-1]
    assert np.array_equal(sample.token_ids, last.token_ids)
