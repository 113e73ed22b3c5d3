"""One Responses-to-chat rule set in two copies: the library's and the fake vLLM's agree with
vLLM 0.32 on every item and tool kind it accepts.

The rules exist twice on purpose: in the library (`tito_agents._capture.responses.chat_view`, which plans
token-in sessions) and in the fake vLLM (`tito_agents.testing.fake_vllm._responses_input`, the
independent oracle the planned prompts are tested against; a shared copy would let a wrong rule
pass on both sides). `CASES` holds each kind with what vLLM 0.32's own `construct_input_messages`
/ `construct_tool_dicts` / `build_chat_params` return for it (run in its venv). The fake must
render each as vLLM does; the library must too, or leave the case to the server with the reason
the case names. A hypothesis test runs both copies over arbitrary item sequences (the merge rules
depend on order), so a rule changed in one copy only fails a test.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tito_agents._capture.responses.chat_view import chat_view
from tito_agents.testing.fake_vllm._fields import FakeHTTPError
from tito_agents.testing.fake_vllm._responses_input import chat_messages, chat_params, chat_tools

TOOL: dict[str, Any] = {
    "type": "function",
    "name": "f",
    "description": "d",
    "parameters": {"type": "object", "properties": {}},
}


U = {"role": "user", "content": "u"}
FN = TOOL
FN_FUNCTION = {k: v for k, v in FN.items() if k != "type"}
FN_CHAT = {"type": "function", "function": FN_FUNCTION}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUT = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "ok", "annotations": []}],
}
REASON = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "think"}],
}


def tc(call_id: str, name: str = "f", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def tool_msg(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def said(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", **fields}


@dataclass(frozen=True)
class Case:
    """A Responses request and what vLLM 0.32 renders it as: `messages` / `tools` (None: vLLM
    refuses the request with the 400 `refused`), `render` the chat render flags and template
    kwargs; `declined` names the reason the library leaves the case to the server."""

    name: str
    payload: dict[str, Any]
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    render: dict[str, Any] = field(default_factory=dict)
    refused: str | None = None
    declined: str | None = None


NS_TOOL = {
    "type": "namespace",
    "name": "crm",
    "description": "CRM tools",
    "tools": [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}},
        {"type": "function", "name": "g", "parameters": {"type": "object"}, "strict": True},
    ],
}
CUSTOM_SHIM = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "description": "The freeform text payload for this tool."}
    },
    "required": ["input"],
    "additionalProperties": False,
}
PARTS = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}

CASES = [
    Case("string input", {"input": "hello"}, [{"role": "user", "content": "hello"}]),
    Case(
        "instructions",
        {"instructions": "be nice", "input": "hi"},
        [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}],
    ),
    Case("easy user message", {"input": [U]}, [U]),
    Case(
        "typed user message with text parts",
        {"input": [{"type": "message", "role": "user", "content": PARTS}]},
        [{"type": "message", "role": "user", "content": PARTS}],
    ),
    Case(
        "system and developer messages",
        {"input": [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}, U]},
        [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"}, U],
    ),
    Case(
        "easy assistant message",
        {"input": [U, {"role": "assistant", "content": "plain"}]},
        [U, said(content="plain")],
    ),
    Case("assistant output message", {"input": [U, OUT]}, [U, said(content="ok")]),
    Case(
        "assistant message with an empty content list",
        {"input": [U, {"role": "assistant", "content": []}, U]},
        [U, said(content=[]), U],
    ),
    Case("reasoning with content", {"input": [U, REASON]}, [U, said(reasoning="think")]),
    Case(
        "reasoning with summary only",
        {
            "input": [
                U,
                {
                    "type": "reasoning",
                    "id": "r",
                    "summary": [{"type": "summary_text", "text": "sum"}],
                },
            ]
        },
        [U, said(reasoning="sum")],
    ),
    Case(
        "reasoning without text",
        {"input": [U, {"type": "reasoning", "id": "r", "summary": []}]},
        [U, said(reasoning="")],
    ),
    Case(
        "reasoning, text and calls merge into one turn",
        {
            "input": [
                *(U, REASON, OUT, CALL, {**CALL, "call_id": "c2", "arguments": '{"x": 1}'}),
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
                {"type": "function_call_output", "call_id": "c2", "output": "43"},
            ],
            "tools": [FN],
        },
        [
            U,
            said(reasoning="think", content="ok", tool_calls=[tc("c1"), tc("c2", "f", '{"x": 1}')]),
            tool_msg("c1", "42"),
            tool_msg("c2", "43"),
        ],
        [FN_CHAT],
    ),
    Case(
        "a call with no assistant message before it",
        {"input": [U, CALL], "tools": [FN]},
        [U, said(tool_calls=[tc("c1")])],
        [FN_CHAT],
    ),
    Case(
        "a second reasoning item starts a new message",
        {"input": [U, REASON, REASON]},
        [U, said(reasoning="think"), said(reasoning="think")],
    ),
    Case(
        "a second text message starts a new message",
        {"input": [U, OUT, OUT]},
        [U, said(content="ok"), said(content="ok")],
    ),
    Case(
        "a call after a tool message starts a new message",
        {
            "input": [
                *(U, CALL, {"type": "function_call_output", "call_id": "c1", "output": "1"}),
                {**CALL, "call_id": "c3"},
            ]
        },
        [U, said(tool_calls=[tc("c1")]), tool_msg("c1", "1"), said(tool_calls=[tc("c3")])],
    ),
    Case(
        "reasoning after a call joins it",
        {"input": [U, CALL, REASON]},
        [U, said(tool_calls=[tc("c1")], reasoning="think")],
    ),
    Case(
        "namespace call and tool",
        {
            "input": [
                *(U, {**CALL, "namespace": "crm"}),
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ],
            "tools": [NS_TOOL],
        },
        [U, said(tool_calls=[tc("c1", "crm__f")]), tool_msg("c1", "ok")],
        [
            {
                "type": "function",
                "function": {
                    "name": "crm__f",
                    "description": "d",
                    "parameters": {"type": "object"},
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "crm__g",
                    "description": None,
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            },
        ],
    ),
    Case(
        "custom tool and call",
        {
            "input": [
                *(U, {"type": "custom_tool_call", "call_id": "k1", "name": "sh", "input": "ls é"}),
                {"type": "custom_tool_call_output", "call_id": "k1", "output": "file"},
            ],
            "tools": [{"type": "custom", "name": "sh", "description": "Run a command."}],
        },
        [U, said(tool_calls=[tc("k1", "sh", '{"input": "ls é"}')]), tool_msg("k1", "file")],
        [
            {
                "type": "function",
                "function": {
                    "name": "sh",
                    "description": "Run a command.",
                    "parameters": CUSTOM_SHIM,
                },
            }
        ],
        declined="custom tool",
    ),
    Case(
        "strict function tools; built-in tools are not rendered",
        {"input": "x", "tools": [{**FN, "strict": True}, {"type": "web_search_preview"}]},
        [{"role": "user", "content": "x"}],
        [{"type": "function", "function": {**FN_FUNCTION, "strict": True}}],
    ),
    Case(
        "tool_choice none keeps the tools",
        {"input": "x", "tools": [FN], "tool_choice": "none"},
        [{"role": "user", "content": "x"}],
        [FN_CHAT],
    ),
    Case(
        "reasoning effort",
        {"input": "x", "reasoning": {"effort": "low"}},
        [{"role": "user", "content": "x"}],
        render={"reasoning_effort": "low", "enable_thinking": True},
    ),
    Case(
        "reasoning effort none with the request's template kwargs",
        {
            "input": "x",
            "reasoning": {"effort": "none"},
            "chat_template_kwargs": {"enable_thinking": True, "k": 1},
        },
        [{"role": "user", "content": "x"}],
        render={"enable_thinking": True, "k": 1, "reasoning_effort": "none"},
    ),
    Case(
        "a partial final message is continued",
        {"input": [U, {**OUT, "status": "in_progress"}]},
        [U, said(content="ok")],
        render={"add_generation_prompt": False, "continue_final_message": True},
        declined="continues its final message",
    ),
    Case(
        "an item reference",
        {"input": [{"type": "item_reference", "id": "x"}]},
        refused="Unsupported input item type: item_reference",
        declined="'item_reference'",
    ),
    Case(
        "encrypted reasoning",
        {"input": [U, {"type": "reasoning", "id": "r", "summary": [], "encrypted_content": "z"}]},
        refused="Encrypted content is not supported.",
        declined="encrypted",
    ),
    Case(
        "an image part",
        {"input": [{"role": "user", "content": [IMAGE]}]},
        [{"role": "user", "content": [{**IMAGE, "detail": "auto"}]}],
        declined="'input_image'",
    ),
]
GENERATION = {"add_generation_prompt": True, "continue_final_message": False}


def parsed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM's chat parser reads them next: item bookkeeping (`type`, `id`,
    `status`) dropped, Responses text parts as chat text parts."""
    keys = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning")
    out = []
    for message in messages:
        message = {k: message[k] for k in keys if k in message}
        if isinstance(message.get("content"), list):
            message["content"] = [
                {"type": "text", "text": p["text"]}
                if p.get("type") in ("input_text", "output_text", "text")
                else p
                for p in message["content"]
            ]
        out.append(message)
    return out


def validated(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat tools as vLLM validates them (`FunctionDefinition`: a missing description or
    parameters is null, an unset strict or defer_loading absent)."""
    out = []
    for tool in tools or []:
        function = tool["function"]
        keep = {"name": function["name"]}
        keep |= {k: function.get(k) for k in ("description", "parameters")}
        keep |= {k: function[k] for k in ("strict", "defer_loading") if function.get(k) is not None}
        out.append({"type": "function", "function": keep})
    return out


def render_of(params: dict[str, Any]) -> dict[str, Any]:
    """The render flags and template kwargs of a chat body, defaults filled in."""
    flags = {k: params.get(k, v) for k, v in GENERATION.items()}
    return {**flags, **params.get("chat_template_kwargs", {})}


def test_the_table_covers_every_item_and_tool_kind_vllm_accepts() -> None:
    items = {
        item.get("type", "message")
        for case in CASES
        if isinstance(case.payload["input"], list)
        for item in case.payload["input"]
    }
    assert items >= {
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "item_reference",
    }
    tools = {tool["type"] for case in CASES for tool in case.payload.get("tools", ())}
    assert tools >= {"function", "namespace", "custom", "web_search_preview"}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_fake_renders_what_vllm_renders(case: Case) -> None:
    payload = copy.deepcopy(case.payload)
    if case.refused is not None:
        with pytest.raises(FakeHTTPError) as refused:
            chat_messages(payload)
        assert refused.value.status == 400 and case.refused in refused.value.message
        return
    assert case.messages is not None
    assert parsed(chat_messages(payload)) == parsed(case.messages)
    assert validated(chat_tools(payload.get("tools"))) == validated(case.tools)
    assert render_of(chat_params(payload)) == {**GENERATION, **case.render}
    assert payload == case.payload  # the request is not changed by rendering it


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_library_plans_what_vllm_renders_or_says_why_not(case: Case) -> None:
    payload = copy.deepcopy(case.payload)
    view = chat_view(payload)
    if case.declined is not None:
        assert isinstance(view, str) and case.declined in view
        return
    assert case.messages is not None and isinstance(view, dict), view
    assert parsed(view["messages"]) == parsed(case.messages)
    assert view["messages"] == parsed(view["messages"])  # already as the chat parser reads them
    assert validated(view.get("tools")) == validated(case.tools)
    assert render_of(view) == {**GENERATION, **case.render}
    assert payload == case.payload


ITEMS = st.sampled_from(
    [
        U,
        {"role": "assistant", "content": "plain"},
        {"type": "message", "role": "developer", "content": PARTS},
        OUT,
        REASON,
        {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "sum"}]},
        CALL,
        {**CALL, "call_id": "c2", "namespace": "crm"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]
)


@given(
    items=st.lists(ITEMS, min_size=1, max_size=8),
    instructions=st.sampled_from([None, "be nice"]),
    tools=st.sampled_from([[], [FN], [NS_TOOL, FN]]),
)
def test_both_copies_agree_on_any_sequence_of_items(
    items: list[dict[str, Any]], instructions: str | None, tools: list[dict[str, Any]]
) -> None:
    """The merge rules depend on the order of items: any sequence the library plans renders
    the same on the fake."""
    payload = {"input": copy.deepcopy(items), "instructions": instructions, "tools": tools}
    view = chat_view(copy.deepcopy(payload))
    if isinstance(view, str):  # only a continued final message is left to the server here
        assert "continues its final message" in view
        return
    assert view["messages"] == parsed(chat_messages(copy.deepcopy(payload)))
    assert validated(view.get("tools")) == validated(chat_tools(tools))
