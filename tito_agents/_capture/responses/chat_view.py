"""The chat conversation a Responses API request renders as on vLLM 0.32 (non-harmony models).

vLLM renders `/v1/responses` through the chat template (`construct_input_messages` and
`construct_tool_dicts` in vllm/entrypoints/openai/responses/utils.py): `instructions` become the
system message, a string `input` one user message, and input items chat messages in order:

* a message item with a role is passed on (an assistant one as its first content part's text);
* `function_call` items become tool calls of the assistant message before them (a new assistant
  message where none precedes; a call in a `namespace` is named `<namespace>__<name>`),
  `function_call_output` items `tool` messages;
* a `reasoning` item becomes the `reasoning` of the assistant message before it (or a new one),
  an assistant output message its `content`, when those are still unset;
* function tools become chat tools (`{"type": "function", "function": {...}}`), the functions of
  a `namespace` tool too, named `<namespace>__<name>`; built-in tools are not rendered;
  `reasoning.effort` becomes the template's `reasoning_effort`.

Token-in sessions use the same conversion on both sides of a turn: the request (`chat_view`) and
the `output` items the server answered with (`assistant_message`), so the chat session planner
(`tito_agents._capture.sessions`) handles Responses calls unchanged. What the conversion does not cover
is a reason to let the server render that call (`chat_view` returns it as a string): server-held
history, a continued final message, non-text content parts, and custom tools with their
`custom_tool_call` items (vLLM shows them as its own single-string function shim; not planned).

The fake vLLM keeps its own copy of these rules (`tito_agents.testing.fake_vllm._responses_input`)
on purpose: it stands in for vLLM in the tests of this module's callers (a session's first prompt
is the fake's render of the request, later ones extend it with deltas planned from `chat_view`),
so one shared implementation would let a wrong rule shape both sides alike and pass; and it must
render what this planner declines. tests/unit/test_responses_chat_rules.py runs both copies over
one table of every item and tool kind vLLM 0.32 accepts, with the messages vLLM's own functions
return, and over arbitrary item sequences, so the two cannot drift apart unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["NAMESPACE_SEPARATOR", "assistant_message", "chat_view"]

_SERVER_HISTORY = (
    "the request continues server-held history (previous_response_id / conversation / "
    "previous_input_messages): the server prepends turns the client never sent, so the token "
    "prompt cannot be planned from the request; send the full input list instead (store=false)"
)
NAMESPACE_SEPARATOR = "__"
"""vLLM's `flat_namespace_tool_name`: function `f` of namespace `crm` is shown as `crm__f`."""
_MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning")
"""Keys of a passed-on message item the chat template can read (`type`, `id`, `status` are item
bookkeeping the server drops when it validates the chat messages)."""


def chat_view(payload: Mapping[str, Any]) -> dict[str, Any] | str:
    """The chat request the server renders for a Responses `payload` (`messages`, `tools`,
    `model`, `chat_template_kwargs`), or why it cannot be known from the request alone."""
    for key in ("previous_response_id", "conversation", "previous_input_messages"):
        if payload.get(key):
            return _SERVER_HISTORY
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            return "instructions is not a string"
        messages.append({"role": "system", "content": instructions})
    items = payload.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        if _continues(items[-1]):
            return "the request continues its final message (status in_progress/incomplete)"
        converted = _messages_of(items, messages)
        if isinstance(converted, str):
            return converted
    else:
        return "the request has no input"
    view: dict[str, Any] = {"messages": messages}
    tools = _chat_tools(payload.get("tools"))
    if isinstance(tools, str):
        return tools
    if tools:
        view["tools"] = tools
    kwargs = _template_kwargs(payload)
    if kwargs:
        view["chat_template_kwargs"] = kwargs
    if payload.get("model"):
        view["model"] = payload["model"]
    return view


def _continues(last: Any) -> bool:
    """vLLM's `should_continue_final_message`: a partial final message or reasoning item is
    continued (no generation prompt), which the planner does not do."""
    if not isinstance(last, Mapping) or last.get("status") not in ("in_progress", "incomplete"):
        return False
    return last.get("type", "message") in ("message", "reasoning")


def assistant_message(output: Any) -> dict[str, Any] | None:
    """The chat assistant message a response's `output` items are sent back as (None when they
    make no single assistant message: no output, or items that do not merge into one)."""
    if not isinstance(output, list) or not output:
        return None
    messages: list[dict[str, Any]] = []
    if isinstance(_messages_of(output, messages), str) or len(messages) != 1:
        return None
    return messages[0] if messages[0].get("role") == "assistant" else None


def _messages_of(items: list[Any], messages: list[dict[str, Any]]) -> str | None:
    """Append the chat messages of `items` to `messages` (vLLM's merge rules); a reason on items
    the conversion does not cover."""
    for item in items:
        if not isinstance(item, Mapping):
            return "an input item is not an object"
        previous = messages[-1] if messages else None
        assistant = previous if previous is not None and previous["role"] == "assistant" else None
        message = _message_of(item, assistant)
        if isinstance(message, str):
            return message
        if message is not None:
            messages.append(message)
    return None


def _message_of(
    item: Mapping[str, Any], assistant: dict[str, Any] | None
) -> dict[str, Any] | str | None:
    """vLLM's `_construct_message_from_response_item`: a new message, None where `assistant`
    took the item in, or a reason where the conversion does not cover it."""
    kind = item.get("type")
    if kind in ("custom_tool_call", "custom_tool_call_output"):
        return f"a {kind} item of a custom tool (custom tools are left to the server)"
    if kind == "function_call":
        name = item.get("name")
        if item.get("namespace"):
            name = f"{item['namespace']}{NAMESPACE_SEPARATOR}{name}"
        call = {
            "id": item.get("call_id"),
            "function": {"name": name, "arguments": item.get("arguments")},
            "type": "function",
        }
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            return "a reasoning item with encrypted content (vLLM refuses it)"
        parts = item.get("content") or item.get("summary") or ()
        first = parts[0] if parts and isinstance(parts[0], Mapping) else {}
        text = first.get("text") or ""
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    text = _assistant_text(item) if kind in (None, "message") else None
    if text is not None:
        if assistant is not None and assistant.get("content") is None:
            assistant["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if "role" in item and kind in (None, "message"):
        message = {k: item[k] for k in _MESSAGE_KEYS if k in item}
        content = message.get("content")
        if isinstance(content, list):
            parts = _text_parts(content)
            if isinstance(parts, str):
                return parts
            message["content"] = parts
        return message
    return f"an input item of type {kind!r} (not rendered as a chat message here)"


def _assistant_text(item: Mapping[str, Any]) -> str | None:
    """The text vLLM takes from an assistant message item (a string, or its first part's text);
    None where it has none (vLLM then passes the item on as it is)."""
    if item.get("role") != "assistant":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def _text_parts(content: list[Any]) -> list[dict[str, Any]] | str:
    """Responses text parts as the chat text parts the server parses them as (`/tokenize`
    validates chat parts: `input_text` is `text` there); other parts (images, files) are a
    reason to let the server render the call."""
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS:
            return f"a content part of type {kind!r} (only text parts are planned)"
        parts.append({"type": "text", "text": part.get("text")})
    return parts


def _chat_tools(tools: Any) -> list[dict[str, Any]] | str | None:
    """Responses function tools (a namespace's functions flattened to `<namespace>__<name>`) as
    chat tools; built-in tools are not rendered (vLLM's `get_function_tools`)."""
    if not tools:
        return None
    if not isinstance(tools, list):
        return "tools is not a list"
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            return "a tool is not an object"
        kind = tool.get("type")
        if kind == "custom":
            return "a custom tool (vLLM shows it as its own single-string function shim)"
        if kind == "function":
            out.append(_function(tool))
        elif kind == "namespace":
            inner = tool.get("tools")
            if not isinstance(inner, list) or not all(isinstance(t, Mapping) for t in inner):
                return "a namespace tool whose tools are not a list of objects"
            prefix = f"{tool.get('name')}{NAMESPACE_SEPARATOR}"
            for function in inner:
                if function.get("type") == "function":
                    out.append(_function({**function, "name": f"{prefix}{function.get('name')}"}))
    return out


def _function(tool: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _template_kwargs(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The chat template kwargs the server renders a Responses request with (`build_chat_params`:
    the request's own, then `reasoning_effort`, and `enable_thinking` unless given)."""
    given = payload.get("chat_template_kwargs")
    kwargs = dict(given) if isinstance(given, Mapping) else {}
    reasoning = payload.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, Mapping) else None
    if effort is not None:
        kwargs["reasoning_effort"] = effort
        if not (isinstance(given, Mapping) and "enable_thinking" in given):
            kwargs["enable_thinking"] = effort != "none"
    return kwargs
