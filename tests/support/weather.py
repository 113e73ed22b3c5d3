"""The weather tool agent several RL and session tests drive: a chat tool schema, the tool's fixed
observation, and the loop a plain openai agent runs (ask, call the tool, read it, answer)."""

from __future__ import annotations

from typing import Any

WEATHER_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
OBSERVATION = "18C, sunny"


def tool_results(message: Any) -> list[dict[str, Any]]:
    """The assistant `message` as history, then one tool result per tool call it made."""
    history = [message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})]
    for call in message.tool_calls or []:
        history.append({"role": "tool", "tool_call_id": call.id, "content": OBSERVATION})
    return history


async def weather_answer(client: Any, model: str, messages: list[Any], turns: int = 3) -> str:
    """Up to `turns` chat calls with the weather tool, each tool call answered with
    OBSERVATION; the first answer without a tool call ("" if none came). Extends `messages`."""
    for _ in range(turns):
        response = await client.chat.completions.create(
            model=model, messages=messages, tools=WEATHER_TOOLS, max_tokens=64
        )
        message = response.choices[0].message
        messages.extend(tool_results(message))
        if not message.tool_calls:
            return str(message.content or "")
    return ""
