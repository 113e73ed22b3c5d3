"""The fake vLLM's own copy of vLLM 0.32's Responses-to-chat rules (non-harmony models).

vLLM renders `/v1/responses` through the chat path (`construct_input_messages`,
`construct_tool_dicts` and `get_function_tools` in vllm/entrypoints/openai/responses/utils.py and
vllm/tool_parsers/utils.py): `instructions` become a system message, a string `input` a user
message, and input items chat messages in order; function, namespace and custom tools become chat
function tools. This module does the same for the fake server, raising the 400 vLLM answers where
it refuses an item.

Why a copy and not `tito_agents._capture.responses.chat_view`: the fake stands in for vLLM in the tests of
the library's Responses capture and token-in sessions, so what it renders must follow vLLM's rules,
not the code under test. In a session the first prompt is the fake's own render of a Responses
request and each later prompt extends it with deltas the planner computed from `chat_view`
renders; with one shared implementation a wrong rule would shape both sides alike and the session
tests (exact prefixes, one merged sample: tests/integration/test_sessions_responses_fake.py) would
pass on a library real vLLM contradicts. The two also differ in kind: `chat_view` is a planner
that returns a reason where it does not plan (custom tools, non-text parts, a continued final
message), while the server must render all of them. The copies cannot drift silently:
tests/unit/test_responses_chat_rules.py runs both over one table of every item and tool kind vLLM
0.32 accepts, with the messages vLLM's own functions return, and over arbitrary item sequences.
"""

from __future__ import annotations

import json
from typing import Any

from tito_agents.testing.fake_vllm._engine import Json
from tito_agents.testing.fake_vllm._requests import bad_request

__all__ = [
    "NAMESPACE_SEPARATOR",
    "chat_messages",
    "chat_params",
    "chat_tool_choice",
    "chat_tools",
]

NAMESPACE_SEPARATOR = "__"
"""vLLM's `flat_namespace_tool_name`: a namespace tool `f` of namespace `crm` is `crm__f`."""
_CUSTOM_INPUT_KEY = "input"
_CUSTOM_PARAMETERS: Json = {
    "type": "object",
    "properties": {
        _CUSTOM_INPUT_KEY: {
            "type": "string",
            "description": "The freeform text payload for this tool.",
        }
    },
    "required": [_CUSTOM_INPUT_KEY],
    "additionalProperties": False,
}
"""The single-string function a `custom` tool is shown to the model as (`custom_tool_parameters`)."""


def chat_messages(body: Json) -> list[Json]:
    """The chat messages vLLM renders for a Responses body (`construct_input_messages`)."""
    messages: list[Json] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise bad_request("input must be a string or a list of items", "input")
    for item in items:
        message = _message_of(item, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def _message_of(item: Any, previous: Json | None) -> Json | None:
    """vLLM's `_construct_message_from_response_item`: None when `previous` absorbed the item."""
    if not isinstance(item, dict):
        raise bad_request("an input item is not an object", "input")
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type", "message")
    call = _tool_call(item, kind)
    if call is not None:
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise bad_request("Encrypted content is not supported.", "input")
        parts = item.get("content") or item.get("summary") or [{}]
        text = parts[0].get("text", "")
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    text = _assistant_text(item) if kind == "message" else None
    if text is not None:
        if assistant is not None and assistant.get("content") is None:
            assistant["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if "role" in item:  # passed on as written; the chat parser drops the item's bookkeeping
        message = {k: v for k, v in item.items() if k != "type"}
        if isinstance(message.get("content"), list):
            message["content"] = [_with_image_detail(part) for part in message["content"]]
        return message
    raise bad_request(f"Unsupported input item type: {kind}", "input")


def _with_image_detail(part: Any) -> Any:
    """vLLM's request validation gives an `input_image` part the API default `detail: auto`."""
    if isinstance(part, dict) and part.get("type") == "input_image" and "detail" not in part:
        return {**part, "detail": "auto"}
    return part


def _tool_call(item: Json, kind: str) -> Json | None:
    """The chat tool call of a `function_call` (its namespace flattened into the name) or a
    `custom_tool_call` (its input wrapped as the shim's JSON arguments)."""
    if kind == "function_call":
        name = item.get("name")
        if item.get("namespace"):
            name = f"{item['namespace']}{NAMESPACE_SEPARATOR}{name}"
        arguments = item.get("arguments")
    elif kind == "custom_tool_call":
        name = item.get("name")
        payload = {_CUSTOM_INPUT_KEY: item.get("input") or ""}
        arguments = json.dumps(payload, ensure_ascii=False)
    else:
        return None
    function = {"name": name, "arguments": arguments}
    return {"id": item.get("call_id"), "function": function, "type": "function"}


def _assistant_text(item: Json) -> str | None:
    """An assistant message's text: a string content or its first part's text (an assistant
    item without one is passed on as written)."""
    if item.get("role") != "assistant":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def chat_params(body: Json) -> Json:
    """The chat render parameters of a Responses body (`ResponsesRequest.build_chat_params`): a
    final message or reasoning item in progress is continued instead of answered, and
    `reasoning.effort` reaches the template as `reasoning_effort` (with `enable_thinking` unless
    the request's own `chat_template_kwargs` set it)."""
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else None
    continued = (
        isinstance(last, dict)
        and last.get("type", "message") in ("message", "reasoning")
        and last.get("status") in ("in_progress", "incomplete")
    )
    given = body.get("chat_template_kwargs")
    kwargs = dict(given) if isinstance(given, dict) else {}
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        kwargs.setdefault("enable_thinking", effort != "none")
    params: Json = {"add_generation_prompt": not continued, "continue_final_message": continued}
    if kwargs:
        params["chat_template_kwargs"] = kwargs
    return params


def chat_tools(tools: list[Json] | None) -> list[Json]:
    """The chat tools the template is shown (`get_function_tools`): function tools as they are,
    a namespace's functions flattened to `<namespace>__<name>`, custom tools as the single-string
    function shim; other tool kinds are not rendered."""
    out: list[Json] = []
    for tool in tools or []:
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool))
        elif kind == "namespace":
            prefix = f"{tool.get('name')}{NAMESPACE_SEPARATOR}"
            for inner in tool.get("tools") or []:
                if inner.get("type") == "function":
                    out.append(_function({**inner, "name": prefix + str(inner.get("name"))}))
        elif kind == "custom":
            shim = {"name": tool.get("name"), "description": tool.get("description")}
            out.append(_function({**shim, "parameters": _CUSTOM_PARAMETERS}))
    return out


def _function(tool: Json) -> Json:
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def chat_tool_choice(choice: Any, tools: list[Json] | None) -> Any:
    """A named function choice as the chat choice, its name resolved to the flat name when it is
    a namespace function's local name (`_resolve_named_tool_choice`, unambiguous names only)."""
    if not (isinstance(choice, dict) and choice.get("type") == "function"):
        return choice
    name = choice.get("name")
    flat = [
        f"{tool.get('name')}{NAMESPACE_SEPARATOR}{name}"
        for tool in tools or []
        if tool.get("type") == "namespace"
        for inner in tool.get("tools") or []
        if inner.get("name") == name
    ]
    plain = any(tool.get("name") == name for tool in tools or [] if tool.get("type") != "namespace")
    if len(flat) == 1 and not plain:
        name = flat[0]
    return {"type": "function", "function": {"name": name}}
