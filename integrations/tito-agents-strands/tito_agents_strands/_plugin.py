"""`AgentNames`: a Strands plugin that names the agent of each captured call and counts the
agent's model calls.

Strands runs every model call of an agent through the agent's middleware chain
(`InvokeModelStage`, public: `agent.add_middleware`). The plugin adds a wrap middleware that
holds the agent's name in a contextvar while the call streams, which a resolver reads when
capture sends the request: an agent run inside another agent's tool makes its calls in its own
chain, so they carry its own name. After each model call that answered, the plugin tells the
episode (`Episode.note_model_call`), so calls made through a client capture never saw are
reported, not silent.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from strands.hooks import AfterModelCallEvent
from strands.middleware import InvokeModelStage, TypedEvent
from strands.plugins import Plugin

from tito_agents.integration import (
    Attribution,
    current_episode,
    register_resolver,
)

if TYPE_CHECKING:
    from strands import Agent
    from strands.middleware import InvokeModelContext

FRAMEWORK = "Strands"
"""How this integration names its framework to the core (`Episode.note_model_call`, and the
fix the core's warnings name)."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_strands_running", default=None
)


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the Strands agent whose model call is streaming,
    or None outside one. Registered by the first `AgentNames` plugin made."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


async def _named_model_call(
    context: InvokeModelContext, next_fn: Callable[[InvokeModelContext], AsyncGenerator[TypedEvent]]
) -> AsyncGenerator[TypedEvent]:
    """The model call, with the calling agent's name set while it streams."""
    token = _RUNNING.set(context.agent.name or None)
    try:
        async for event in next_fn(context):
            yield event
    finally:
        _RUNNING.reset(token)


def _count_model_call(event: AfterModelCallEvent) -> None:
    """One model call answered: counted on the episode it ran in."""
    episode = current_episode()
    if episode is not None and event.stop_response is not None:
        episode.note_model_call(FRAMEWORK)


class AgentNames(Plugin):
    """Add to each agent, `Agent(model, name="solver", plugins=[AgentNames()])`: its captured
    calls carry its `name` (an explicit `tito_agents.agent(...)` scope still wins), and its
    model calls are counted on the episode so any that went around capture are reported
    (`collector.stats.bypassed_calls`)."""

    name = "tito-agents"

    def __init__(self) -> None:
        super().__init__()
        register_resolver(resolve_agent)

    def init_agent(self, agent: Agent) -> None:
        agent.add_middleware(InvokeModelStage, _named_model_call)
        agent.add_hook(_count_model_call, AfterModelCallEvent)
