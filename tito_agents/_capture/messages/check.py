"""What vLLM 0.32's `AnthropicMessagesRequest` accepts, read strictly (for `messages.convert`).

vLLM validates a `/v1/messages` body with pydantic (vllm/entrypoints/anthropic/protocol.py) and
answers a refused one in its OpenAI error shape (`validation_exception_handler`), with pydantic's
own wording. Capture does not imitate that answer: a body these checks refuse is sent to
`/v1/messages` as written, uncaptured, and the caller gets vLLM's own. So the checks only need to
accept nothing vLLM refuses: they read strict JSON types (pydantic's lax coercions, such as
`"5"` for an int, are refused here and left to the server) and ignore unknown fields as pydantic
does (`extra="ignore"`: Claude Code's `context_management`, `metadata` contents, `cache_control`
on blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "TOOL_CHANGES",
    "Refused",
    "check_block",
    "check_blocks",
    "check_message",
    "check_tool",
    "get",
]

TOOL_CHANGES = ("tool_addition", "tool_removal")
"""Blocks that change the tool list; vLLM allows them only in `role: system` messages."""
_BLOCK_TYPES = frozenset(
    {"text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking"}
).union(TOOL_CHANGES)
_BLOCK_STR = ("text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data")
"""`AnthropicContentBlock` fields typed `str | None`."""
_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: type(v) is str,
    "int": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "bool": lambda v: type(v) is bool,
    "dict": lambda v: type(v) is dict,
    "list": lambda v: type(v) is list,
}


class Refused(Exception):
    """The request is left to the server (the message says why)."""


def get(data: Mapping[str, Any], key: str, kind: str, where: str = "") -> Any:
    """`data[key]`, None when null or absent; refused unless strictly of `kind`."""
    value = data.get(key)
    if value is not None and not _CHECKS[kind](value):
        raise Refused(f"{where}{key} is not a {kind} (left to vLLM's validation)")
    return value


def check_message(message: Any) -> None:
    """An `AnthropicMessage`: a role and a string or a list of blocks."""
    if type(message) is not dict or message.get("role") not in ("user", "assistant", "system"):
        raise Refused("a message is not an object with role user, assistant or system")
    content = message.get("content")
    if type(content) is not str:
        check_blocks(content, "message content", message["role"] == "system")


def check_blocks(blocks: Any, where: str, allow_tool_changes: bool) -> None:
    """A list of blocks (tool_addition / tool_removal only where `allow_tool_changes`)."""
    if type(blocks) is not list:
        raise Refused(f"{where} is not a string or a list of blocks")
    for block in blocks:
        check_block(block, where)
        if not allow_tool_changes and block["type"] in TOOL_CHANGES:
            raise Refused(f"a {block['type']} block outside a system message")


def check_block(block: Any, where: str) -> None:
    """An `AnthropicContentBlock` (`validate_tool_change` included)."""
    if type(block) is not dict or block.get("type") not in _BLOCK_TYPES:
        raise Refused(f"{where}: a block is not an object of a known type")
    for key in _BLOCK_STR:
        get(block, key, "str", "block ")
    get(block, "source", "dict", "block ")
    get(block, "input", "dict", "block ")
    get(block, "is_error", "bool", "block ")
    content = block.get("content")
    if content is not None and type(content) is not str and not _objects(content):
        raise Refused("a block's content is not a string or a list of objects")
    change = block.get("tool")
    if change is None:
        if block["type"] in TOOL_CHANGES:
            raise Refused(f"a {block['type']} block without its tool")
        return
    if type(change) is not dict or change.get("type") not in ("tool_reference", "tool_definition"):
        raise Refused("a block's tool is not a tool_reference or tool_definition")
    if change["type"] == "tool_reference":
        if type(change.get("name")) is not str:
            raise Refused("a tool_reference without a name")
    else:
        check_tool(change.get("definition"))
        if block["type"] == "tool_removal":
            raise Refused("tool_removal only accepts a tool_reference")


def _objects(value: Any) -> bool:
    return type(value) is list and all(type(item) is dict for item in value)


def check_tool(value: Any) -> dict[str, Any]:
    """An `AnthropicTool` as vLLM holds it: `input_schema` gets `type: object` (appended, as
    vLLM's validator does) when it has no type."""
    if type(value) is not dict or type(value.get("name")) is not str:
        raise Refused("a tool is not an object with a name")
    get(value, "description", "str", "tool ")
    get(value, "strict", "bool", "tool ")
    get(value, "defer_loading", "bool", "tool ")
    schema = value.get("input_schema")
    if type(schema) is not dict:
        raise Refused("a tool's input_schema is not an object")
    schema = dict(schema)
    schema.setdefault("type", "object")
    return {**value, "input_schema": schema}
