"""Fast checks against a real CPU vLLM 0.32 serving SmolLM2-135M-Instruct (plain httpx only).

The server does roughly 10-20 tokens/s on 2 cores, so every request keeps max_tokens small.
Run with: ``python -m pytest tests/e2e -m e2e``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.e2e

# SmolLM2 ids: <|im_start|>=1, <|im_end|>=2 (EOS), "ass"=520, "istant"=9531, "\n"=198.
GENERATION_PROMPT = [1, 520, 9531, 198]
EOS = 2
# "<tool_call>" is not one token in SmolLM2's vocabulary: "<", "tool", "_", "call", ">".
TOOL_CALL_START = [44, 19324, 79, 4350, 46]

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
# strict=True makes vLLM constrain the arguments to the schema (without it the 135M model tends to
# copy the schema into the arguments).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


def _chat(client: httpx.Client, base_url: str, model: str, **body: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "messages": MESSAGES,
        "temperature": 0,
        "return_token_ids": True,
    }
    payload.update(body)
    resp = client.post(f"{base_url}/chat/completions", json=payload)
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def test_server_lists_the_model(client: httpx.Client, vllm_base_url: str, vllm_model: str) -> None:
    resp = client.get(f"{vllm_base_url}/models")
    assert resp.status_code == 200
    models = {m["id"]: m for m in resp.json()["data"]}
    assert vllm_model == "SmolLM2-135M-Instruct"
    assert vllm_model in models
    assert models[vllm_model]["max_model_len"] >= 1024


def test_return_token_ids_and_usage_counts(
    client: httpx.Client, vllm_base_url: str, vllm_model: str
) -> None:
    data = _chat(client, vllm_base_url, vllm_model, max_tokens=8)
    prompt_ids = data["prompt_token_ids"]
    choice = data["choices"][0]
    assert isinstance(prompt_ids, list) and all(isinstance(t, int) for t in prompt_ids)
    assert prompt_ids[0] == 1  # no BOS: the prompt starts with <|im_start|>
    assert prompt_ids[-4:] == GENERATION_PROMPT
    assert data["usage"]["prompt_tokens"] == len(prompt_ids)
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert 1 <= len(choice["token_ids"]) <= 8
    if choice["finish_reason"] == "stop":
        assert choice["token_ids"][-1] == EOS


def test_stream_token_ids_concatenate_to_non_stream(
    client: httpx.Client, vllm_base_url: str, vllm_model: str
) -> None:
    ns = _chat(client, vllm_base_url, vllm_model, max_tokens=6)
    payload = {
        "model": vllm_model,
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 6,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    prompt_ids: list[int] | None = None
    ids: list[int] = []
    with client.stream("POST", f"{vllm_base_url}/chat/completions", json=payload) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("prompt_token_ids") is not None:
                prompt_ids = chunk["prompt_token_ids"]
            for choice in chunk["choices"]:
                ids += choice.get("token_ids") or []
    assert prompt_ids == ns["prompt_token_ids"]
    assert ids == ns["choices"][0]["token_ids"]


def test_tokenize_equals_chat_prompt_token_ids_with_tools(
    client: httpx.Client, vllm_base_url: str, vllm_model: str
) -> None:
    root = vllm_base_url.removesuffix("/v1")
    tok = client.post(
        f"{root}/tokenize",
        json={
            "model": vllm_model,
            "messages": MESSAGES,
            "tools": [WEATHER_TOOL],
            "add_generation_prompt": True,
        },
    )
    assert tok.status_code == 200, tok.text
    chat = _chat(client, vllm_base_url, vllm_model, tools=[WEATHER_TOOL], max_tokens=1)
    assert tok.json()["tokens"] == chat["prompt_token_ids"]
    assert tok.json()["count"] == chat["usage"]["prompt_tokens"]


def test_tool_call_required_is_parsed(
    client: httpx.Client, vllm_base_url: str, vllm_model: str
) -> None:
    data = _chat(
        client,
        vllm_base_url,
        vllm_model,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=64,
    )
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert len(calls) == 1
    assert calls[0]["function"]["name"] == "get_weather"
    args = json.loads(calls[0]["function"]["arguments"])
    assert isinstance(args, dict) and isinstance(args.get("city"), str)
    # token_ids are the raw sampled tokens: the multi-token markup, the JSON, the EOS.
    assert choice["token_ids"][: len(TOOL_CALL_START)] == TOOL_CALL_START
    assert choice["token_ids"][-1] == EOS
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_kv_transfer_prompt_token_ids_are_used_as_the_prompt(
    client: httpx.Client, vllm_base_url: str, vllm_model: str
) -> None:
    ids = [1, 4093, 198, 26843, 17, 2, 198, *GENERATION_PROMPT]  # user turn "Hi!"
    data = _chat(
        client,
        vllm_base_url,
        vllm_model,
        max_tokens=4,
        kv_transfer_params={"prompt_token_ids": ids},
    )
    assert data["prompt_token_ids"] == ids
    assert data["usage"]["prompt_tokens"] == len(ids)


def test_rescoring_reproduces_sampled_logprobs(
    client: httpx.Client, vllm_base_url: str, vllm_model: str
) -> None:
    data = _chat(client, vllm_base_url, vllm_model, max_tokens=12, logprobs=True)
    prompt_ids = data["prompt_token_ids"]
    choice = data["choices"][0]
    sampled = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(sampled) == len(choice["token_ids"])
    resp = client.post(
        f"{vllm_base_url}/completions",
        json={
            "model": vllm_model,
            "prompt": prompt_ids + choice["token_ids"],
            "max_tokens": 1,
            "prompt_logprobs": 0,
        },
    )
    assert resp.status_code == 200, resp.text
    prompt_logprobs = resp.json()["choices"][0]["prompt_logprobs"]
    deltas = [
        abs(prompt_logprobs[len(prompt_ids) + i][str(tok)]["logprob"] - lp)
        for i, (tok, lp) in enumerate(zip(choice["token_ids"], sampled, strict=True))
    ]
    # bf16 noise between the decode and the prefill path (measured: mean ~0.04, max ~0.33).
    assert statistics.mean(deltas) < 0.15, deltas
    assert max(deltas) < 1.0, deltas
