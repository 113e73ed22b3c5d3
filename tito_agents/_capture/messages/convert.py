"""The chat completion request vLLM 0.32 runs for an Anthropic Messages request.

vLLM's `/v1/messages` has no `return_token_ids`: it validates the body as
`AnthropicMessagesRequest` and converts it to a `ChatCompletionRequest`
(`AnthropicServingMessages.to_chat_completion_request`, vllm/entrypoints/anthropic/serving.py),
then runs the chat completion and converts the answer back. Capture takes the same road one step
earlier: it sends vLLM's own conversion to `/v1/chat/completions` (where `prepare_request` adds
`return_token_ids`, so the ids are exact and the chat parser records the call), and converts the
chat answer back with `messages.reply`, which mirrors vLLM's converters. The engine sees the
same chat request either way, so the caller's view equals what `/v1/messages` would have answered.
(The alternative, `/v1/messages/render` then token-in, needs `--enable-scale-out` and a second
conversion of the answer; this one needs nothing but the chat endpoint.)

`chat_request` follows vLLM's rules: top-level `system` (text blocks joined, Claude Code's
`x-anthropic-billing-header` block dropped) and `role: system` messages (kept in place, or merged
into the leading system message when the server's template wants system first:
`merge_inline_system`); text, image, thinking, tool_use, tool_result blocks; tools and
tool_addition / tool_removal blocks; tool_choice; stop_sequences; `output_config`; `thinking`
(`disabled` becomes the server's probed `disabled_thinking_effort`); streaming with
`include_usage` and `continuous_usage_stats` (vLLM's stream converter reads usage from the first
chunk). `metadata`, `mm_payload` and unknown fields are dropped, as pydantic ignores them.

It returns a reason instead of a request (capture then sends the caller's request to
`/v1/messages` unchanged, uncaptured, so the caller gets vLLM's own answer, errors included) when
the body is not one vLLM's model accepts as written (only strictly typed values are read; pydantic's
lax coercions are left to the server) and where vLLM's internal conversion skips a check the chat
endpoint would make (`tools: []`, a `tool_choice` without tools or naming an unknown tool: vLLM
assigns those after building the request, so its validators never see them).

The returned request shares nested values (schemas, kwargs) with `payload`: serialize it, do not
mutate it. tests/unit/test_messages_wire.py compares it, validated as the chat endpoint validates
it, with vLLM's own conversion on hundreds of generated requests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from tito_agents._capture.messages.check import (
    TOOL_CHANGES,
    Refused,
    check_blocks,
    check_message,
    check_tool,
    get,
)

__all__ = ["EFFORTS", "MAX_STOP_STRINGS", "chat_request"]

EFFORTS = ("low", "medium", "high", "xhigh", "max")
"""`AnthropicEffort` (output_config.effort); `none` or one of these is the server's
`disabled_thinking_effort`."""
MAX_STOP_STRINGS = 4
"""`VLLM_MAX_STOP_STRINGS`'s default, the longest `stop_sequences` vLLM accepts."""
_BILLING = "x-anthropic-billing-header"
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_PASSED = (
    ("temperature", "number"),
    ("top_p", "number"),
    ("top_k", "int"),
    ("watermarking", "bool"),
    ("cache_salt", "str"),
    ("kv_transfer_params", "dict"),
    ("ec_transfer_params", "dict"),
    ("vllm_xargs", "dict"),
    ("chat_template_kwargs", "dict"),
)
"""Request fields vLLM passes to the chat request as they are (`_build_base_request`), after
`max_tokens` (twice) and `stop_sequences` (as `stop`), and the type each must have."""


def chat_request(
    payload: Mapping[str, Any],
    *,
    merge_inline_system: bool = False,
    disabled_thinking_effort: str = "none",
    max_stop_strings: int = MAX_STOP_STRINGS,
) -> dict[str, Any] | str:
    """The chat completion request (the fields vLLM sets) that vLLM 0.32 runs for the Messages
    request `payload`, or why capture leaves the request to `/v1/messages`.

    `merge_inline_system` and `disabled_thinking_effort` are the server's own probes of its chat
    template (`_should_merge_inline_system`, `_get_disabled_thinking_effort`; `messages.probe`
    finds them out); the defaults are `to_chat_completion_request`'s."""
    if not isinstance(payload, Mapping):
        return "the request body is not a JSON object"
    try:
        return _convert(payload, merge_inline_system, disabled_thinking_effort, max_stop_strings)
    except Refused as refused:
        return str(refused)


def _convert(
    payload: Mapping[str, Any], merge: bool, disabled_effort: str, max_stop: int
) -> dict[str, Any]:
    model = get(payload, "model", "str")
    if not model:
        raise Refused("model is missing or empty")
    messages = get(payload, "messages", "list")
    if messages is None:
        raise Refused("messages is missing")
    for message in messages:
        check_message(message)
    max_tokens = get(payload, "max_tokens", "int")
    if max_tokens is None or max_tokens <= 0:
        raise Refused("max_tokens is missing or not positive")
    system = payload.get("system")
    if system is not None and type(system) is not str:
        check_blocks(system, "system", allow_tool_changes=False)
    stop = get(payload, "stop_sequences", "list")
    if stop is not None and (len(stop) > max_stop or any(type(s) is not str for s in stop)):
        raise Refused(f"stop_sequences is not a list of at most {max_stop} strings")
    get(payload, "metadata", "dict")
    stream = get(payload, "stream", "bool")
    if payload.get("mm_payload", "tensors") not in ("tensors", "none"):
        raise Refused("mm_payload is not 'tensors' or 'none'")
    get(payload, "return_mm_kwargs", "bool")
    chat: dict[str, Any] = {"model": model}
    chat["messages"] = _chat_messages(payload, messages, merge)
    chat["max_tokens"] = max_tokens
    chat["max_completion_tokens"] = max_tokens
    chat["stop"] = stop
    for key, kind in _PASSED:
        chat[key] = get(payload, key, kind)
    if any(not _xarg(value) for value in (chat["vllm_xargs"] or {}).values()):
        raise Refused("a vllm_xargs value is not a string, number or list of them")
    salt = chat["cache_salt"]
    if salt is not None and not 1 <= len(salt) <= 1024:
        raise Refused("cache_salt is not 1 to 1024 characters")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    _output_config(payload, chat)
    _thinking(payload, chat, max_tokens, disabled_effort)
    _tools(payload, chat)
    return chat


# --------------------------------------------------------------------------------------------------
# Messages (`_convert_system_message`, `_convert_messages`)


def _chat_messages(
    payload: Mapping[str, Any], messages: list[dict[str, Any]], merge: bool
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[str] = []
    system = payload.get("system")
    if isinstance(system, str) and system:
        parts.append(system)
    elif system:
        parts += _texts(system)
    if merge:
        for message in messages:
            text = _system_text(message) if message["role"] == "system" else None
            if text:
                parts.append(text)
    if parts:
        out.append({"role": "system", "content": "".join(parts)})
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            text = None if merge else _system_text(message)
            if text:
                out.append({"role": "system", "content": text})
            continue
        chat: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            chat["content"] = content
        else:
            _content(content, role, chat, out)
        if not (role == "user" and "content" not in chat):
            out.append(chat)
    return out


def _texts(blocks: list[dict[str, Any]]) -> list[str]:
    """The text of a block list's text blocks, billing headers left out."""
    return [
        block["text"]
        for block in blocks
        if block["type"] == "text" and block.get("text") and not block["text"].startswith(_BILLING)
    ]


def _system_text(message: dict[str, Any]) -> str | None:
    content = message["content"]
    if isinstance(content, str):
        return None if content.startswith(_BILLING) else content
    return "".join(_texts(content)) or None


def _content(
    blocks: list[dict[str, Any]], role: str, chat: dict[str, Any], out: list[dict[str, Any]]
) -> None:
    """`_convert_message_content`: blocks into `chat`; a user's tool results go to `out` first."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            name = block.get("name") or ""
            call_id = block.get("id") or f"call_{int(time.time())}"
            function = {"name": name, "arguments": arguments}
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            _user_tool_result(block, out)
        elif kind == "tool_result":
            result = block.get("content")
            parts.append({"type": "text", "text": f"Tool result: {str(result) if result else ''}"})
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        chat["content"] = parts[0]["text"]
    elif parts:
        chat["content"] = parts


def _image_url(source: Any) -> str:
    """`_convert_image_source_to_url`: a url source's url, else a base64 data URI."""
    if type(source) is not dict:
        raise Refused("an image source is not an object")
    if source.get("type") == "url":
        url = source.get("url", "")
        if type(url) is not str:
            raise Refused("an image url is not a string")
        return url
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _user_tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """`_convert_user_tool_result`: a tool message, then a user message with the result's images
    and a tool message with its tool references."""
    text, images, references = "", [], []
    content = block.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for item in content:
            kind = item.get("type")
            if kind == "text":
                part = item.get("text", "")
                if type(part) is not str:
                    raise Refused("a tool_result text item without a text string")
                texts.append(part)
            elif kind == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
        out.append({"role": "user", "content": parts})
    if references:
        out.append({"role": "tool", "tool_call_id": call_id, "content": references})


# --------------------------------------------------------------------------------------------------
# Options (`_handle_output_config`, `_handle_thinking`, `_convert_tool_choice`, `_convert_tools`)


def _output_config(payload: Mapping[str, Any], chat: dict[str, Any]) -> None:
    config = get(payload, "output_config", "dict")
    if not config:
        return
    effort = config.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise Refused("output_config.effort is not low, medium, high, xhigh or max")
    output_format = get(config, "format", "dict", "output_config.")
    if output_format is not None:
        if output_format.get("type", "json_schema") != "json_schema":
            raise Refused("output_config.format.type is not json_schema")
        schema = get(output_format, "schema", "dict", "output_config.format.")
        if schema:
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"schema": schema, "name": "json_schema"},
            }
    if effort is not None:
        chat["reasoning_effort"] = effort


def _thinking(
    payload: Mapping[str, Any], chat: dict[str, Any], max_tokens: int, disabled_effort: str
) -> None:
    thinking = get(payload, "thinking", "dict")
    if thinking is None:
        return
    kind = thinking.get("type")
    display = thinking.get("display")
    if kind not in ("enabled", "disabled", "adaptive") or (
        kind != "disabled" and display not in (None, "summarized", "omitted", "updates")
    ):
        raise Refused("thinking is not an enabled, disabled or adaptive configuration")
    if kind == "disabled":
        chat["reasoning_effort"] = disabled_effort
    elif kind == "enabled":
        budget = get(thinking, "budget_tokens", "int", "thinking.")
        if budget is None or budget < 1024:
            raise Refused("thinking.budget_tokens is missing or below 1024")
        remote = (chat["kv_transfer_params"] or {}).get("do_remote_decode")
        if budget >= max_tokens and not remote:
            raise Refused("thinking.budget_tokens is not below max_tokens")
        chat["thinking_token_budget"] = budget


def _tools(payload: Mapping[str, Any], chat: dict[str, Any]) -> None:
    choice = get(payload, "tool_choice", "dict")
    tools = _resolved_tools(payload)
    names = {tool["name"] for tool in tools or ()}
    if choice is None:
        chat["tool_choice"] = None
    else:
        kind = choice.get("type")
        name = get(choice, "name", "str", "tool_choice.")
        disable = get(choice, "disable_parallel_tool_use", "bool", "tool_choice.")
        if kind not in ("auto", "any", "tool", "none") or (kind == "tool" and not name):
            raise Refused("tool_choice is not auto, any, none or a named tool")
        if kind != "none" and (not tools or (kind == "tool" and name not in names)):
            raise Refused("tool_choice needs tools vLLM's conversion does not check")
        chat["parallel_tool_calls"] = not disable
        chat["tool_choice"] = (
            {"type": "function", "function": {"name": name}} if kind == "tool" else _CHOICES[kind]
        )
    if tools is None:
        return
    if not tools:
        raise Refused("tools is empty (the chat endpoint refuses what vLLM's conversion allows)")
    chat["tools"] = [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description"),
                "parameters": tool["input_schema"],
                "strict": tool.get("strict"),
                "defer_loading": tool.get("defer_loading"),
            },
        }
        for tool in tools
    ]
    if chat["tool_choice"] is None:
        chat["tool_choice"] = "auto"


def _resolved_tools(payload: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """`_resolve_tools`: the declared tools after the messages' tool_addition / tool_removal."""
    declared = get(payload, "tools", "list")
    tools = None if declared is None else [check_tool(value) for value in declared]
    changes = [
        block
        for message in payload["messages"]
        if not isinstance(message["content"], str)
        for block in message["content"]
        if block["type"] in TOOL_CHANGES
    ]
    if not changes:
        return tools
    by_name = {tool["name"]: tool for tool in tools or ()}
    removed: set[str] = set()
    for block in changes:
        change = block["tool"]
        if change["type"] == "tool_definition":
            name = change["definition"]["name"]
            by_name[name] = check_tool(change["definition"])
        else:
            name = change["name"]
            if name not in by_name:
                raise Refused(f"{block['type']} references an undeclared tool")
            if block["type"] == "tool_addition":
                by_name[name] = {**by_name[name], "defer_loading": None}
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in by_name.items() if name not in removed]


def _xarg(value: Any) -> bool:
    """A `vllm_xargs` value vLLM accepts: a string, a number or a list of them."""
    if type(value) is list:
        return all(type(item) in (str, int, float) for item in value)
    return type(value) in (str, int, float)
