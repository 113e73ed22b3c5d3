"""The conversations the template audit renders: one per case, in a few message dialects.

A case is a conversation ending in an assistant turn (plain or with tool calls, with or without
reasoning, with or without `tools`) and a check: either `generation` (the assistant turn must extend
the generation prompt that preceded it: the sampled ids sit right after the prompt) or `append ROLE`
(appending a tool result, user, system or assistant message must extend the earlier rendering: the
next call's prompt starts with this call's history). Templates differ in what message shapes they
accept (tool-call arguments as a mapping or a JSON string, content as text or blocks, a system
message or none), so each case is tried in several dialects and the first the template renders is used.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ASSISTANT_TEXT",
    "REASONING_TEXT",
    "TOOLS",
    "TOOL_NAME",
    "USER_TEXT",
    "AuditCase",
    "Content",
    "Dialect",
    "all_cases",
    "conversation",
    "dialects",
    "expected_content",
    "head",
]

Message = dict[str, Any]
Check = Literal["generation", "append"]
AppendedRole = Literal["tool", "user", "system", "assistant"]

SYSTEM_TEXT = "You are a careful assistant."
USER_TEXT = "What is the weather in Paris today?"
ASSISTANT_TEXT = "Let me check that for you."
FINAL_TEXT = "It is sunny in Paris."
REASONING_TEXT = "The user asks about the weather; the tool answers that."
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = {"city": "Paris"}
TOOL_RESULT = '{"city": "Paris", "sky": "sunny", "temp_c": 21}'
APPENDED_TEXT = {
    "user": "Thanks! And tomorrow?",
    "system": "Answer in one sentence.",
    "assistant": "Anything else?",
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "The current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city."}},
                "required": ["city"],
            },
        },
    }
]
APPENDED_ROLES: tuple[AppendedRole, ...] = ("tool", "user", "system", "assistant")


@dataclass(frozen=True, slots=True)
class AuditCase:
    """One prefix-preservation check of the audit."""

    check: Check
    tool_calls: bool
    reasoning: bool
    tools: bool
    appended: AppendedRole | None = None

    @property
    def case_id(self) -> str:
        """A stable short name, e.g. `tool_calls+reasoning/tools:+user`."""
        shape = "tool_calls" if self.tool_calls else "plain"
        shape += "+reasoning" if self.reasoning else ""
        shape += "/tools" if self.tools else ""
        action = "gen" if self.check == "generation" else f"+{self.appended}"
        return f"{shape}:{action}"

    @property
    def description(self) -> str:
        turn = "assistant with tool calls" if self.tool_calls else "plain assistant"
        turn += " + reasoning" if self.reasoning else ""
        turn += ", tools given" if self.tools else ""
        if self.check == "generation":
            return f"{turn}: turn extends the generation prompt"
        return f"{turn}: append {self.appended}"


def all_cases() -> list[AuditCase]:
    """Every case: for each assistant turn shape, the generation check and each sensible append.

    A tool result is only appended after an assistant turn that called a tool (anything else is not
    a conversation any API sends).
    """
    cases = []
    for tool_calls, reasoning, tools in itertools.product((False, True), repeat=3):
        cases.append(AuditCase("generation", tool_calls, reasoning, tools))
        for role in APPENDED_ROLES:
            if role == "tool" and not tool_calls:
                continue
            cases.append(AuditCase("append", tool_calls, reasoning, tools, role))
    return cases


@dataclass(frozen=True, slots=True)
class Dialect:
    """How messages are spelled for one template."""

    system: bool = True
    arguments_as_json: bool = False
    content_blocks: bool = False
    tool_call_content: bool = True

    def describe(self) -> str:
        parts = []
        if not self.system:
            parts.append("no system message")
        if self.arguments_as_json:
            parts.append("tool arguments as JSON text")
        if self.content_blocks:
            parts.append("content as blocks")
        if not self.tool_call_content:
            parts.append("no content beside tool calls")
        return ", ".join(parts) or "default"


def dialects() -> Iterator[Dialect]:
    """Dialects in order of preference: the OpenAI/transformers spelling first."""
    for system, as_json, blocks, tc_content in itertools.product(
        (True, False), (False, True), (False, True), (True, False)
    ):
        yield Dialect(system, as_json, blocks, tc_content)


def conversation(case: AuditCase, dialect: Dialect) -> tuple[list[Message], list[Message]]:
    """(earlier, later) message lists of a case: the later one is rendered after the earlier one.

    For `generation`, earlier ends before the assistant turn (rendered with the generation prompt);
    for `append`, earlier ends with the assistant turn and later adds the appended message.
    """
    start = head(dialect)
    turn = _assistant(case, dialect)
    if case.check == "generation":
        return start, [*start, turn]
    assert case.appended is not None
    return [*start, turn], [*start, turn, _appended(case.appended, dialect)]


def head(dialect: Dialect) -> list[Message]:
    """The messages before the assistant turn: an optional system message and the user's question."""
    messages: list[Message] = []
    if dialect.system:
        messages.append(_message("system", SYSTEM_TEXT, dialect))
    messages.append(_message("user", USER_TEXT, dialect))
    return messages


@dataclass(frozen=True, slots=True)
class Content:
    """A piece of a message a case adds, which the rendering that adds it must show.

    `part` is "turn" (the assistant turn) or "appended" (the appended message). It counts as
    present when it occurs more often in the rendering with the message than in the one without
    (the tools block, for one, already names the tool)."""

    label: str
    text: str
    part: Literal["turn", "appended"]


TOOL_RESULT_MARKER = "temp_c"
"""A part of `TOOL_RESULT` no other message holds (the result may be re-serialized as JSON)."""


def expected_content(case: AuditCase, dialect: Dialect, *, reasoning: bool = True) -> list[Content]:
    """What the case's assistant turn and appended message hold, as the renderings must show it.

    `reasoning=False` leaves reasoning out (a template that never renders `reasoning_content`)."""
    found: list[Content] = []
    if case.tool_calls:
        if dialect.tool_call_content:
            found.append(Content("assistant text", ASSISTANT_TEXT, "turn"))
        found.append(Content("tool call name", TOOL_NAME, "turn"))
        for key, value in TOOL_ARGUMENTS.items():
            found.append(Content("tool call arguments", key, "turn"))
            found.append(Content("tool call arguments", value, "turn"))
    else:
        found.append(Content("assistant text", FINAL_TEXT, "turn"))
    if case.reasoning and reasoning:
        found.append(Content("reasoning", REASONING_TEXT, "turn"))
    if case.appended == "tool":
        found.append(Content("tool result", TOOL_RESULT_MARKER, "appended"))
    elif case.appended is not None:
        found.append(Content(f"{case.appended} text", APPENDED_TEXT[case.appended], "appended"))
    return found


def _message(role: str, text: str, dialect: Dialect) -> Message:
    content: Any = [{"type": "text", "text": text}] if dialect.content_blocks else text
    return {"role": role, "content": content}


def _assistant(case: AuditCase, dialect: Dialect) -> Message:
    if not case.tool_calls:
        message = _message("assistant", FINAL_TEXT, dialect)
    else:
        text = ASSISTANT_TEXT if dialect.tool_call_content else ""
        message = _message("assistant", text, dialect)
        arguments: Any = json.dumps(TOOL_ARGUMENTS) if dialect.arguments_as_json else TOOL_ARGUMENTS
        message["tool_calls"] = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": TOOL_NAME, "arguments": arguments},
            }
        ]
    if case.reasoning:
        message["reasoning_content"] = REASONING_TEXT
    return message


def _appended(role: AppendedRole, dialect: Dialect) -> Message:
    if role == "tool":
        message = _message("tool", TOOL_RESULT, dialect)
        message.update(tool_call_id="call_1", name=TOOL_NAME)
        return message
    return _message(role, APPENDED_TEXT[role], dialect)
