"""`AgentNames`: Agent Framework agent middleware that names the agent of each captured call.

Agent Framework runs each agent invocation through the agent's middleware (`AgentMiddleware`,
public: `Agent(..., middleware=[...])`), whose context names the agent (`context.agent.name`).
A run that is not streamed sends its requests inside the middleware, so a scope around
`call_next()` names them. A streamed run (`run(..., stream=True)`, and an agent used as another
agent's tool, `as_tool()`, streams) sends nothing until its stream is read, after the middleware
has returned: the middleware hands back a stream that sets the scope again while it is read.
A resolver reads the scope when capture sends the request; an agent run inside another's tool
sets its own, so its calls carry its own name.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from agent_framework import AgentContext, AgentMiddleware, ResponseStream

from tito_agents.integration import Attribution, register_resolver

FRAMEWORK = "Microsoft Agent Framework"
"""How this integration names its framework to the core (the fix its warnings name)."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_agent_framework_running", default=None
)


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the Agent Framework agent whose run sends it, or
    None outside one. Registered by the first `AgentNames` made."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


def _named_stream(stream: ResponseStream[Any, Any], name: str | None) -> ResponseStream[Any, Any]:
    """`stream`, read with the agent's name set (its requests are sent as it is read); its
    final response is the original's, hooks included."""

    async def updates() -> AsyncGenerator[Any]:
        token = _RUNNING.set(name)
        try:
            async for update in stream:
                yield update
        finally:
            _RUNNING.reset(token)

    async def final(_updates: Sequence[Any]) -> Any:
        return await stream.get_final_response()

    return ResponseStream(updates(), finalizer=final)


class AgentNames(AgentMiddleware):
    """Add to each agent, `Agent(client=..., name="solver", middleware=[AgentNames()])`: its
    captured calls carry its `name`, streamed or not (an explicit `tito_agents.agent(...)`
    scope still wins)."""

    def __init__(self) -> None:
        register_resolver(resolve_agent)

    async def process(
        self, context: AgentContext, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        name = getattr(context.agent, "name", None) or None
        token = _RUNNING.set(name)
        try:
            await call_next()
        finally:
            _RUNNING.reset(token)
        if context.stream and isinstance(context.result, ResponseStream):
            context.result = _named_stream(context.result, name)
