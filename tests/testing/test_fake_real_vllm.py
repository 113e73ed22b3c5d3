"""The fake against a real vLLM 0.32 serving the same model: the same prompt ids, token for token.

tests/data/real_vllm holds requests and responses of SmolLM2-135M-Instruct on a real CPU vLLM with
the project's tool template: the fake's model and template. What the model *says* differs (the
fake has a scripted responder, not weights), but everything before sampling must not: every
request renders to the real server's `prompt_token_ids`, `/tokenize` and `/detokenize` answer
byte-identical JSON, and `/v1/models` names the same model with the same context length. Wire
structure is compared on more shapes in test_fake_captures.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.capture_replay import REAL_VLLM, Capture, capture_names, load_capture
from tests.support.fake_vllm_calls import DONE, call, parse_sse
from tito_agents.testing import FakeConfig, FakeVLLM
from tito_agents.testing.smollm2 import MODEL_NAME

NAMES = capture_names(REAL_VLLM)
ERRORS = {n for n in NAMES if n.startswith("responses_err") or n == "responses_previous_id"}
"""Captures of vLLM's error answers: the fake answers the same status and body."""
SAME_BODY = {"tokenize_chat", "tokenize_prompt", "multi_turn_tool_tokenize", "detokenize"}


@pytest.fixture(scope="module")
def real_like(tokenizer: Any) -> FakeVLLM:
    """A fake configured as the real server was (`--max-model-len 4096`)."""
    return FakeVLLM(FakeConfig(max_model_len=4096, tokenizer=tokenizer))


def prompt_ids(capture_path: str, response: Any) -> list[int] | None:
    """The prompt ids of a body or of the first chunk that has them (chat: top level;
    completions: per choice)."""
    items = response if isinstance(response, list) else [response]
    if capture_path.endswith("/responses"):  # the body, or the stream's final event
        final = [i["response"] for i in items if i.get("type") == "response.completed"]
        return list((final or items)[0]["input_messages"][0]["tokens"])
    for item in items:
        if item == DONE or not item.get("choices"):
            continue
        holder = item if capture_path.endswith("/chat/completions") else item["choices"][0]
        if holder.get("prompt_token_ids") is not None:
            return list(holder["prompt_token_ids"])
    return None


def replay(fake: FakeVLLM, capture: Capture) -> Any:
    result = call(fake, capture.path, capture.request, method=capture.method)
    assert result.status == capture.status, result.raw[:300]
    return result.events if result.events is not None else result.body


def test_every_real_capture_is_compared() -> None:
    assert len(NAMES) >= 19, REAL_VLLM
    assert set(NAMES) >= SAME_BODY and "models" in NAMES


NO_IDS = {"models", "responses_ns_plain", "responses_store_followup"}
"""Captures without prompt ids the fake can give: `responses_ns_plain` (a Responses request
without enable_response_messages; its shape is compared in test_fake_responses) and
`responses_store_followup` (a server that stores responses; the fake, like vLLM's default, stores
none and answers `previous_response_id` with the 404 of `responses_previous_id`)."""


@pytest.mark.parametrize("name", [n for n in NAMES if n not in SAME_BODY | ERRORS | NO_IDS])
def test_the_prompt_renders_to_the_real_ids(real_like: FakeVLLM, name: str) -> None:
    """Chat with and without tools, a tool-result turn, token prompts, completions on ids,
    Responses requests (instructions, function tools, function_call items and outputs): the
    fake's prompt ids are the real server's."""
    capture = load_capture(name, REAL_VLLM)
    want = prompt_ids(
        capture.path, parse_sse(capture.body) if capture.is_stream else capture.json()
    )
    assert want, name
    assert prompt_ids(capture.path, replay(real_like, capture)) == want


@pytest.mark.parametrize("name", sorted(SAME_BODY | ERRORS))
def test_tokenize_and_detokenize_answer_the_real_body(real_like: FakeVLLM, name: str) -> None:
    capture = load_capture(name, REAL_VLLM)
    assert replay(real_like, capture) == capture.json()


def test_models_names_the_real_model(real_like: FakeVLLM) -> None:
    capture = load_capture("models", REAL_VLLM)
    ours, theirs = replay(real_like, capture)["data"][0], capture.json()["data"][0]
    assert ours["id"] == theirs["id"] == MODEL_NAME
    assert ours["max_model_len"] == theirs["max_model_len"] == 4096
