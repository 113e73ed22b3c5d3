"""Anthropic Messages over vLLM's chat endpoint: the request conversion (`_wire.messages_chat`)
and the answer conversion (`_wire.messages_reply`), by vLLM 0.32's rules.

The tables are read from vllm/entrypoints/anthropic/serving.py; the last test runs vLLM's own
converters (its venv, tests/support/vllm_anthropic_oracle.py) on generated cases and compares.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import messages_cases
from tito_agents._capture.messages.convert import chat_request
from tito_agents._capture.messages.probe import (
    disabled_effort_from,
    effort_probes,
    merge_from_counts,
    merge_probe,
)
from tito_agents._capture.messages.reply import (
    MessagesStream,
    ReplyError,
    encode_body,
    encode_event,
    messages_response,
)

_ROOT = Path(__file__).resolve().parents[2]
_VLLM_PYTHON = Path("~/.cache/tito-agents/vllm-venv/bin/python").expanduser()


def _convert(payload: dict[str, Any], **options: Any) -> dict[str, Any]:
    chat = chat_request({"model": "m", "max_tokens": 64, **payload}, **options)
    assert isinstance(chat, dict), chat
    return chat


# --------------------------------------------------------------------------------------------------
# Requests


def test_system_blocks_join_and_the_billing_header_is_dropped() -> None:
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=ab12"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": " Be brief."},
    ]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
        {"role": "user", "content": "go"},
    ]
    chat = _convert({"system": system, "messages": messages})
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code. Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": "go"},
    ]
    merged = _convert({"system": system, "messages": messages}, merge_inline_system=True)
    assert merged["messages"] == [
        {"role": "system", "content": "You are Claude Code. Be brief.reminder"},
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "go"},
    ]


def test_tool_turns_become_tool_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "need a tool", "signature": "s"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": "P"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [
                        {"type": "text", "text": "sunny"},
                        {"type": "text", "text": "20C"},
                        {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
                    ],
                },
                {"type": "text", "text": "thanks"},
            ],
        },
    ]
    chat = _convert({"messages": messages})
    call = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"c": "P"}'},
    }
    assert chat["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "reasoning": "need a tool",
            "tool_calls": [call],
            "content": "Let me check.",
        },
        # the tool message comes before the rest of the user turn, its images after it
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny\n20C"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
        },
        {"role": "user", "content": "thanks"},
    ]


def test_options_map_as_vllm_maps_them() -> None:
    tools = [{"name": "f", "input_schema": {"properties": {}}}]
    chat = _convert(
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": tools,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "stream": True,
            "thinking": {"type": "disabled"},
            "output_config": {"effort": "high"},
            "metadata": {"user_id": "u"},
            "context_management": {"edits": []},
        },
        disabled_thinking_effort="low",
    )
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": None,
                "parameters": {"properties": {}, "type": "object"},
                "strict": None,
                "defer_loading": None,
            },
        }
    ]
    assert chat["stop"] == ["END"] and chat["max_completion_tokens"] == 64
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert chat["reasoning_effort"] == "low"  # thinking.disabled wins over output_config.effort
    assert "metadata" not in chat and "context_management" not in chat
    named = _convert({"messages": [], "tools": tools, "tool_choice": {"type": "tool", "name": "f"}})
    assert named["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert _convert({"messages": []})["tool_choice"] is None
    budget = _convert(
        {"max_tokens": 4096, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 2048}}
    )
    assert budget["thinking_token_budget"] == 2048


@pytest.mark.parametrize(
    "change",
    [
        {"max_tokens": None},
        {"max_tokens": 0},
        {"max_tokens": "64"},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "f"}}
                    ],
                }
            ]
        },
        {"tools": []},
        {"tool_choice": {"type": "auto"}},
        {
            "tools": [{"name": "f", "input_schema": {}}],
            "tool_choice": {"type": "tool", "name": "g"},
        },
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"stop_sequences": ["1", "2", "3", "4", "5"]},
        {"temperature": "0.5"},
    ],
)
def test_what_vllm_may_refuse_is_left_to_it(change: dict[str, Any]) -> None:
    payload = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}]}
    assert isinstance(chat_request({**payload, **change}), str)


def test_the_server_side_choices_are_probed_as_vllm_decides_them() -> None:
    count, merged, unmerged = merge_probe("m")
    assert count["system"] == "Hello." and len(merged["messages"]) == 3
    assert len(unmerged["messages"]) == 4  # one more system message: more tokens
    assert merge_from_counts(25, 25, 30) is True and merge_from_counts(30, 25, 30) is False
    assert merge_from_counts(30, None, 30) is False and merge_from_counts(7, 7, 7) is None
    probes = effort_probes("m")
    assert list(probes) == ["none", "low", "medium", "high", "xhigh", "max"]
    assert probes["none"]["chat_template_kwargs"]["enable_thinking"] is False
    # a template that ignores the effort (SmolLM2): "none" renders as "low" does, so "low"
    assert disabled_effort_from({effort: [1, 2] for effort in probes}) == "low"
    assert disabled_effort_from({"none": None, "low": [1]}) == "low"
    assert disabled_effort_from({"none": [1], "low": [2], "high": [3]}) == "none"


# --------------------------------------------------------------------------------------------------
# Answers


def _body(message: dict[str, Any], finish: str | None = "stop", stop: Any = None) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "finish_reason": finish,
        "stop_reason": stop,
        "token_ids": [1],
    }
    usage = {
        "prompt_tokens": 10,
        "total_tokens": 13,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    return {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [choice],
        "usage": usage,
        "kv_transfer_params": None,
    }


def test_a_chat_body_becomes_the_messages_body() -> None:
    call = {
        "id": "chatcmpl-tool-1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a": null}'},
    }
    body = messages_response(
        _body({"content": "ok", "reasoning": "hm", "tool_calls": [call]}, "tool_calls"),
        signature=lambda: "SIG",
    )
    assert encode_body(body) == (
        b'{"id":"chatcmpl-1","type":"message","role":"assistant","content":['
        b'{"type":"thinking","thinking":"hm","signature":"SIG"},{"type":"text","text":"ok"},'
        b'{"type":"tool_use","id":"chatcmpl-tool-1","name":"f","input":{"a":null}}],"model":"m",'
        b'"stop_reason":"tool_use","usage":{"input_tokens":6,"output_tokens":3,'
        b'"cache_read_input_tokens":4}}'
    )
    empty = messages_response(_body({"content": None}, "length"))
    assert empty["content"] == [{"type": "text", "text": ""}]
    assert empty["stop_reason"] == "max_tokens"
    matched = messages_response(_body({"content": "a"}, "stop", "END"))
    assert (matched["stop_reason"], matched["stop_sequence"]) == ("stop_sequence", "END")
    assert "stop_reason" not in messages_response(_body({"content": "a"}, "abort"))
    assert messages_response(_body({"content": "a"}, "stop", 2))["stop_reason"] == "end_turn"


def test_tool_arguments_vllm_cannot_decode_are_its_400() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": '}}
    with pytest.raises(ReplyError) as raised:
        messages_response(_body({"tool_calls": [call]}, "tool_calls"))
    assert raised.value.status == 400
    assert raised.value.body["error"]["type"] == "BadRequestError"


def _chunk(delta: dict[str, Any], finish: str | None = None, stop: Any = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if finish:
        choice["stop_reason"] = stop
    return {"id": "chatcmpl-s", "model": "m", "choices": [choice]}


def _run(chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    stream = MessagesStream(signature=lambda: "SIG")
    events = []
    for chunk in chunks:
        events += stream.chunk(chunk)
    return events + stream.done()


_START = {
    "id": "chatcmpl-s",
    "model": "m",
    "choices": [_chunk({"role": "assistant"})["choices"][0]],
    "usage": {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7},
}
_USAGE = {
    "id": "chatcmpl-s",
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
}


def test_a_stream_becomes_messages_events_as_they_arrive() -> None:
    stream = MessagesStream(signature=lambda: "SIG")
    assert [name for name, _ in stream.chunk(_START)] == ["message_start"]
    assert [name for name, _ in stream.chunk(_chunk({"reasoning": "hm"}))] == [
        "content_block_start",
        "content_block_delta",
    ]
    events = stream.chunk(_chunk({"content": "Hi"}))  # the thinking block ends, a text one starts
    assert [name for name, _ in events] == [
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
    ]
    assert events[0][1] == {
        "type": "content_block_delta",
        "delta": {"type": "signature_delta", "signature": "SIG"},
        "index": 0,
    }
    assert events[3][1]["index"] == 1 and events[3][1]["delta"]["text"] == "Hi"
    assert stream.chunk(_chunk({}, "stop", None)) == []
    names = [name for name, _ in stream.chunk(_USAGE)]
    assert names == ["content_block_stop", "message_delta"]
    assert [name for name, _ in stream.done()] == ["message_stop"]


def test_text_inside_a_tool_call_waits_for_the_block_to_end() -> None:
    call = {"index": 0, "id": "t1", "type": "function", "function": {"name": "f", "arguments": ""}}
    events = _run(
        [
            _START,
            _chunk({"tool_calls": [call]}),
            _chunk({"content": "stray"}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}),
            _chunk({}, "tool_calls"),
            _USAGE,
        ]
    )
    wire = b"".join(encode_event(name, data) for name, data in events).decode()
    assert wire.count("event: content_block_start") == 2
    assert '"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}},"index":0' in wire
    assert '{"type":"input_json_delta","partial_json":"{\\"a\\": 1}"},"index":0' in wire
    assert '"content_block":{"type":"text","text":""},"index":1' in wire
    assert '"delta":{"stop_reason":"tool_use","stop_sequence":null}' in wire
    assert wire.endswith('event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_a_stop_string_that_cuts_the_arguments_is_a_stop_sequence() -> None:
    call = {"index": 0, "id": "t1", "function": {"name": "f", "arguments": '{"a": '}}
    events = _run([_START, _chunk({"tool_calls": [call]}), _chunk({}, "stop", "END"), _USAGE])
    delta = next(data for name, data in events if name == "message_delta")["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_an_unreadable_chunk_ends_the_stream_with_an_error_event() -> None:
    events = _run([_START, {"error": {"message": "boom"}}, _chunk({"content": "late"})])
    assert [name for name, _ in events] == ["message_start", "error"]
    assert events[1][1]["error"]["type"] == "internal_error"


# --------------------------------------------------------------------------------------------------
# Side by side with vLLM's own converters


_LEFT_BY_DESIGN = (
    "tool_choice needs tools",
    "tools is empty",
    "temperature is not",
    "stream is not",
)
_LEFT_BY_DESIGN += ("max_tokens is not",)


def _oracle(cases: dict[str, Any]) -> dict[str, Any]:
    if not _VLLM_PYTHON.exists():
        pytest.skip("vLLM venv not prepared: run scripts/vllm_server.py prepare")
    script = _ROOT / "tests" / "support" / "vllm_anthropic_oracle.py"
    done = subprocess.run(
        [str(_VLLM_PYTHON), str(script)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _mine_stream(chunks: list[Any]) -> str:
    stream = MessagesStream(signature=lambda: "SIG")
    events = [event for chunk in chunks for event in stream.chunk(chunk)] + stream.done()
    return b"".join(encode_event(name, data) for name, data in events).decode()


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_conversions_equal_vllms_own_side_by_side() -> None:
    rng = random.Random(30)
    requests = []
    for _ in range(600):
        payload = messages_cases.request(rng)
        merge, effort = rng.random() < 0.3, rng.choice(["none", "low"])
        mine = chat_request(
            copy.deepcopy(payload), merge_inline_system=merge, disabled_thinking_effort=effort
        )
        requests.append({"payload": payload, "merge": merge, "effort": effort, "mine": mine})
    responses = [messages_cases.response(rng) for _ in range(300)]
    captures = _ROOT / "tests" / "data" / "captures"
    streams = [messages_cases.stream(rng) for _ in range(400)]
    for name in ("chat_stream.txt", "tool_auto_stream.txt", "chat_stream_lp.txt"):
        streams += messages_cases.capture_streams((captures / name).read_text())
    result = _oracle({"requests": requests, "responses": responses, "streams": streams})

    converted = 0
    for case, seen in zip(requests, result["requests"], strict=True):
        if isinstance(case["mine"], str):
            # left to /v1/messages: what vLLM refuses, and by design what it accepts only because
            # its conversion skips the chat validators, or reads in pydantic's lax mode
            assert "refused" in seen["vllm"] or case["mine"].startswith(_LEFT_BY_DESIGN), case
            continue
        converted += 1
        assert "refused" not in seen["vllm"], (case, seen)
        assert seen["mine"] == seen["vllm"], case
    assert converted >= 300, converted

    for body, seen in zip(responses, result["responses"], strict=True):
        try:
            mine = encode_body(messages_response(body, signature=lambda: "SIG")).decode()
        except ReplyError as error:
            assert (error.status, error.body["error"]["type"]) == (
                seen["status"],
                seen["body"]["error"]["type"],
            ), body
            assert error.body["error"]["message"] == seen["body"]["error"]["message"]
            continue
        assert (seen["status"], seen.get("text")) == (200, mine), body

    for chunks, theirs in zip(streams, result["streams"], strict=True):
        mine = _mine_stream(chunks)
        if "event: error" in theirs:  # pydantic's message there, approximated here
            mine, theirs = mine.partition("event: error")[0], theirs.partition("event: error")[0]
        assert mine == theirs, chunks
