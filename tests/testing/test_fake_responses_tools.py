"""The fake's `/v1/responses` with the tool kinds vLLM 0.32 flattens into chat function tools:
namespace tools (`<namespace>__<name>` in the prompt, the call answered under its own name and
namespace) and custom tools (the single-string shim), and a continued final message.

The conversion rules themselves are checked against vLLM's own output in
tests/unit/test_responses_chat_rules.py; here the server around them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.fake_vllm_calls import call
from tito_agents.testing import FakeConfig, FakeVLLM, RequestView, hermes_tool_call

NAMESPACE = {
    "type": "namespace",
    "name": "crm",
    "description": "CRM tools",
    "tools": [
        {
            "type": "function",
            "name": "lookup",
            "description": "Find a customer.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ],
}
CUSTOM = {"type": "custom", "name": "shell", "description": "Run a command."}


def calling(view: RequestView) -> str:
    return hermes_tool_call("crm__lookup", {"q": "ada"}) if view.tools else "Hello."


@pytest.fixture(scope="module")
def fake(tokenizer: Any) -> FakeVLLM:
    return FakeVLLM(FakeConfig(tokenizer=tokenizer, responder=calling))


@pytest.mark.parametrize("stream", [False, True])
def test_a_namespace_call_is_answered_under_its_name_and_namespace(
    fake: FakeVLLM, stream: bool
) -> None:
    body = {"model": "SmolLM2-135M-Instruct", "input": "Who is ada?", "tools": [NAMESPACE]}
    result = call(fake, "/v1/responses", {**body, "stream": stream})
    assert result.status == 200
    if stream:
        events = result.chunks
        done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert [e["name"] for e in done] == ["lookup"]
        output = events[-1]["response"]["output"]
    else:
        output = result.body["output"]
    (item,) = [i for i in output if i["type"] == "function_call"]
    assert (item["name"], item["namespace"]) == ("lookup", "crm")
    # sent back, the call renders under the flat name the model was shown
    turn = [{"role": "user", "content": "Who is ada?"}, item]
    again = call(fake, "/v1/responses", {**body, "input": turn, "enable_response_messages": True})
    prompt = again.body["input_messages"][0]["message"]
    assert prompt.count("crm__lookup") == 2  # once among the tools, once in the past call


def test_a_custom_tool_is_shown_as_the_single_string_shim(fake: FakeVLLM) -> None:
    body = {
        "model": "SmolLM2-135M-Instruct",
        "input": "List files.",
        "tools": [CUSTOM],
        "enable_response_messages": True,
    }
    result = call(fake, "/v1/responses", body)
    assert result.status == 200
    prompt = result.body["input_messages"][0]["message"]
    assert '"shell"' in prompt and "The freeform text payload for this tool." in prompt
    assert result.body["tools"] == [CUSTOM]  # echoed as given


def test_a_partial_final_message_is_continued(fake: FakeVLLM) -> None:
    partial = {"type": "message", "role": "assistant", "status": "in_progress", "content": "Hel"}
    body = {
        "model": "SmolLM2-135M-Instruct",
        "input": [{"role": "user", "content": "Hi"}, partial],
        "enable_response_messages": True,
    }
    result = call(fake, "/v1/responses", body)
    assert result.status == 200
    prompt = result.body["input_messages"][0]["message"]
    assert prompt.endswith("Hel")  # no end of turn, no new assistant header
