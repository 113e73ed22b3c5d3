"""The chat conversation a Responses request renders as (vLLM 0.32's conversion rules).

The expected messages are what vLLM 0.32's own `construct_input_messages` /
`construct_tool_dicts` / `build_chat_params` return for the same request (run in its venv); the
real server's `input_messages` tokens equal `/tokenize` of these conversations
(tests/e2e/test_sessions_real.py).

tests/unit/test_responses_chat_rules.py runs the library and the fake vLLM's copy of these rules
over one table of every item and tool kind vLLM accepts.
"""

from __future__ import annotations

from typing import Any

import pytest

from tito_agents._capture.responses.chat_view import assistant_message, chat_view

TOOL = {
    "type": "function",
    "name": "f",
    "description": "d",
    "parameters": {"type": "object", "properties": {}},
}


def test_items_become_the_messages_vllm_renders() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"text": "think"}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "developer", "content": "dev"},
        {"role": "assistant", "content": "plain"},
    ]
    view = chat_view({"model": "m", "instructions": "be nice", "input": items, "tools": [TOOL]})
    assert isinstance(view, dict)
    call = {"id": "c1", "function": {"name": "f", "arguments": "{}"}, "type": "function"}
    call2 = {"id": "c2", "function": {"name": "f", "arguments": '{"x": 1}'}, "type": "function"}
    assert view["messages"] == [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
        # item bookkeeping (type) dropped; Responses text parts as the chat parts /tokenize takes
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        # reasoning, text and calls of one model turn merge into one assistant message
        {"role": "assistant", "reasoning": "think", "content": "ok", "tool_calls": [call, call2]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "developer", "content": "dev"},
        {"role": "assistant", "content": "plain"},
    ]
    assert view["tools"] == [
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": TOOL["parameters"]},
        }
    ]
    assert view["model"] == "m" and "chat_template_kwargs" not in view


def test_string_input_and_reasoning_effort() -> None:
    view = chat_view(
        {
            "input": "hello",
            "reasoning": {"effort": "low"},
            "tools": [{"type": "web_search_preview"}],
        }
    )
    assert isinstance(view, dict)
    assert view["messages"] == [{"role": "user", "content": "hello"}]
    assert "tools" not in view  # built-in tools are not rendered
    assert view["chat_template_kwargs"] == {"reasoning_effort": "low", "enable_thinking": True}
    given = chat_view(
        {
            "input": "x",
            "reasoning": {"effort": "none"},
            "chat_template_kwargs": {"enable_thinking": True, "k": 1},
        }
    )
    assert isinstance(given, dict)
    assert given["chat_template_kwargs"] == {
        "enable_thinking": True,
        "k": 1,
        "reasoning_effort": "none",
    }


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "server-held history"),
        ({"input": "x", "conversation": "conv_1"}, "server-held history"),
        ({"input": []}, "no input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "'item_reference'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "'input_image'",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]},
            "'refusal'",
        ),
        ({"input": "x", "tools": [{"type": "custom", "name": "c"}]}, "custom tool"),
        (
            {"input": [{"type": "reasoning", "encrypted_content": "…", "summary": []}]},
            "encrypted",
        ),
        (
            {"input": [{"type": "message", "role": "assistant", "status": "incomplete"}]},
            "continues its final message",
        ),
    ],
)
def test_what_the_conversion_does_not_cover_is_a_reason(
    payload: dict[str, Any], reason: str
) -> None:
    got = chat_view(payload)
    assert isinstance(got, str) and reason in got


def test_assistant_message_of_a_response_output() -> None:
    output = [
        {"type": "reasoning", "id": "rs", "summary": [], "content": [{"text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "t"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": "fc"},
    ]
    call = {"id": "c", "function": {"name": "f", "arguments": "{}"}, "type": "function"}
    assert assistant_message(output) == {
        "role": "assistant",
        "reasoning": "hm",
        "content": "t",
        "tool_calls": [call],
    }
    assert assistant_message([]) is None
    two = [output[1], output[1]]  # two text messages do not merge into one turn
    assert assistant_message(two) is None


def test_a_namespaced_call_in_the_output_comes_back_under_its_flat_name() -> None:
    output = [{"type": "function_call", "call_id": "c", "name": "f", "namespace": "crm"}]
    message = assistant_message(output)
    assert message is not None and message["tool_calls"][0]["function"]["name"] == "crm__f"
