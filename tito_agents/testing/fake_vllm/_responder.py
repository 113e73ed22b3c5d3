"""The default "model" of the fake vLLM: short plausible answers, and tool calls when tools are offered.

It behaves like a small instruct model that has learned the Hermes tool format:

* chat with tools (and `tool_choice` not `"none"`) whose last message is not a tool result: one
  `<tool_call>` for the named tool, or the first tool, with arguments made up from its JSON schema
  and the user's words (`get_weather` + "weather in paris" -> `{"city": "Paris"}`);
* chat after a tool result: a sentence that uses the result;
* other chat: one of a few short answers about the user's question;
* completions: a short continuation.

Outputs are deterministic in (prompt, seed, choice index); with temperature 0 every choice gives the
same answer, as greedy decoding would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tito_agents.testing.fake_vllm._hash import mix, text_key
from tito_agents.testing.fake_vllm._model import RequestView

__all__ = ["default_responder", "hermes_tool_call"]

_ANSWERS = (
    "Sure! {topic}: the short answer is yes, and it is simpler than it looks.",
    "Good question. About {topic}, I would say it depends on the details, but usually it works.",
    "Here is a brief answer on {topic}. Start small, check the result, then improve it.",
    "I looked into {topic}. In short, the answer is no, but there is an easy workaround.",
)
_CONTINUATIONS = (
    " and that is how the story begins.",
    ", which is a good place to start.",
    " is one of the most common examples.",
    " and many people agree with that.",
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def hermes_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The text a Hermes-format model emits for one tool call (what vLLM's hermes parser reads)."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def default_responder(view: RequestView) -> str:
    """Plausible short output for any request; see the module docstring."""
    if view.endpoint == "completions":
        return _CONTINUATIONS[_choice(view, view.prompt_text) % len(_CONTINUATIONS)]
    last = view.messages[-1] if view.messages else {}
    tool = _tool_to_call(view, last)
    if tool is not None:
        function = tool.get("function") or {}
        arguments = _arguments(function.get("parameters") or {}, _user_text(view.messages))
        return hermes_tool_call(str(function.get("name", "tool")), arguments)
    if last.get("role") == "tool":
        return (
            f"The tool returned: {_content(last).strip() or 'nothing'}. That answers the question."
        )
    user = _user_text(view.messages)
    template = _ANSWERS[_choice(view, user) % len(_ANSWERS)]
    return template.format(topic=_topic(user))


def _choice(view: RequestView, text: str) -> int:
    return mix(text_key(text), view.sample_key) & 0xFFFF


def _tool_to_call(view: RequestView, last: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if not view.tools or view.tool_choice == "none":
        return None
    choice = view.tool_choice
    if isinstance(choice, Mapping):
        wanted = (choice.get("function") or {}).get("name")
        return next(
            (t for t in view.tools if (t.get("function") or {}).get("name") == wanted), None
        )
    if choice == "required" or last.get("role") != "tool":
        return view.tools[0]
    return None


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _content(message)
    return ""


def _topic(user_text: str) -> str:
    words = _WORD.findall(user_text)[-6:]
    return " ".join(words).lower() if words else "your question"


def _arguments(schema: Mapping[str, Any], user_text: str) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    names = schema.get("required") or list(properties)
    return {name: _value(properties.get(name) or {}, user_text) for name in names}


def _value(schema: Mapping[str, Any], user_text: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "string")
    defaults: dict[str, Any] = {
        "integer": 3,
        "number": 2.5,
        "boolean": True,
        "array": [],
        "object": {},
    }
    if kind in defaults:
        return defaults[kind]
    words = _WORD.findall(user_text)
    capitalised = [w for w in words[1:] if w[0].isupper()]
    if capitalised:
        return capitalised[0]
    return words[-1].capitalize() if words else "example"
