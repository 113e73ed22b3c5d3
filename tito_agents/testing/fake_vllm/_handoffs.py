"""A fake model that takes handoffs, for multi-agent graphs (supervisors, swarms, triage agents).

Multi-agent frameworks hand a conversation from one agent to another through tools named
`transfer_to_<agent>` (langgraph-supervisor, langgraph-swarm, the OpenAI Agents SDK) or
`transfer_back_to_<agent>`. `handoff_responder` plays every agent of such a graph from what the
request shows (its tools and messages since the latest user message), deterministically:

1. a tool the user's message names (a handoff by its agent: "ask the math_expert", "speak to Bob";
   another tool by its name) that no call since that message used: that tool, in the order the
   tools are offered;
2. after a result of one of its own (non-handoff) tools: an answer that uses it;
3. own tools, none called since the user's message: the first one (arguments as the default
   responder makes them);
4. handoff tools only, and no handoff since the user's message: the first one;
5. otherwise an answer.

So a supervisor offered `transfer_to_math_expert` and `transfer_to_research_expert` (or experts
as tools named `math_expert` and `research_expert`) for "ask the math_expert and the
research_expert" visits both, each expert calls its first tool once and answers, then the
supervisor answers; a swarm's Alice hands "I'd like to speak to Bob" to Bob, who answers.
`tool_choice` "none" or naming a tool is obeyed first, as the default responder does.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tito_agents.testing.fake_vllm._model import RequestView
from tito_agents.testing.fake_vllm._responder import (
    _arguments,
    _content,
    default_responder,
    hermes_tool_call,
)

__all__ = ["HANDOFF_PREFIXES", "handoff_responder", "handoff_target"]

HANDOFF_PREFIXES = ("transfer_back_to_", "transfer_to_")
"""Tool-name prefixes of handoffs in langgraph-supervisor, langgraph-swarm and the Agents SDK."""

_NOT_WORD = re.compile(r"[^a-z0-9]+")


def handoff_target(tool_name: str) -> str | None:
    """The agent a handoff tool transfers to (normalised, lower snake case), or None."""
    for prefix in HANDOFF_PREFIXES:
        if tool_name.startswith(prefix):
            return _normalise(tool_name.removeprefix(prefix))
    return None


def handoff_responder(view: RequestView) -> str:
    """What an agent of a multi-agent graph says next; see the module docstring."""
    if view.endpoint != "chat" or not view.tools or view.tool_choice == "none":
        return default_responder(view)
    if isinstance(view.tool_choice, Mapping):
        return default_responder(view)
    tools = {_tool_name(t): t for t in view.tools}
    own = [name for name in tools if handoff_target(name) is None]
    handoffs = [name for name in tools if handoff_target(name) is not None]
    user_text, since = _since_user(view.messages)
    called = _called_tools(since)
    named = f"_{_normalise(user_text)}_"
    for name in tools:
        if name not in called and f"_{handoff_target(name) or _normalise(name)}_" in named:
            return _call(tools[name], user_text)
    last = view.messages[-1] if view.messages else {}
    if last.get("role") == "tool" and _answered_tool(view.messages, last) in own:
        return default_responder(_without_tools(view))  # "The tool returned: ..."
    if own and not called.intersection(own):
        return _call(tools[own[0]], user_text)
    if handoffs and not _handed_off(called):
        return _call(tools[handoffs[0]], user_text)
    return default_responder(_without_tools(view))


def _handed_off(called: set[str]) -> bool:
    return any(handoff_target(name) is not None for name in called)


def _normalise(text: str) -> str:
    return _NOT_WORD.sub("_", text.lower()).strip("_")


def _tool_name(tool: Mapping[str, Any]) -> str:
    return str((tool.get("function") or {}).get("name", ""))


def _call(tool: Mapping[str, Any], user_text: str) -> str:
    function = tool.get("function") or {}
    arguments = _arguments(function.get("parameters") or {}, user_text)
    return hermes_tool_call(str(function.get("name", "tool")), arguments)


def _since_user(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str, Sequence[Mapping[str, Any]]]:
    """The latest user message's text and the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return _content(messages[index]), messages[index + 1 :]
    return "", messages


def _called_tools(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    names: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            names.add(str((call.get("function") or {}).get("name", "")))
    return names


def _answered_tool(messages: Sequence[Mapping[str, Any]], result: Mapping[str, Any]) -> str | None:
    """The name of the tool whose call `result` (a tool message) answers."""
    wanted = result.get("tool_call_id")
    for message in reversed(messages):
        for call in message.get("tool_calls") or ():
            if call.get("id") == wanted:
                return str((call.get("function") or {}).get("name", ""))
    return None


def _without_tools(view: RequestView) -> RequestView:
    return dataclasses.replace(view, tools=(), tool_choice=None)
