"""Which PydanticAI agent is making a request: the agent of the run context PydanticAI sets
around every model request, streamed or not.

PydanticAI enters its run context (`RunContext`, whose `agent` is the running `Agent`) in a
contextvar for the span of each model request, and a run started inside a tool (delegation)
enters its own: read when capture sends the request, it names the innermost agent, so a delegated
agent's calls are never put down to the agent whose tool ran it. The getter lives in a private
module (`pydantic_ai._run_context`); `install` checks it is there, so a release that moves it is
refused at once rather than leaving every call without an agent.
"""

from __future__ import annotations

from typing import Any

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "PydanticAI"
"""How this integration names its framework to the core (`Episode.note_model_call`, and the
fix the core's warnings name)."""


def _run_context_getter() -> Any:
    """PydanticAI's getter of the current run context, or a `ConfigurationError` saying the
    installed release has none where this integration reads it."""
    try:
        from pydantic_ai import _run_context
    except ImportError as exc:
        raise ConfigurationError(
            "tito_agents_pydantic_ai needs pydantic-ai (pip install 'pydantic-ai-slim[openai]')"
        ) from exc
    getter = getattr(_run_context, "get_current_run_context", None)
    if getter is None:
        raise ConfigurationError(
            "this pydantic-ai release has no pydantic_ai._run_context.get_current_run_context, "
            "where tito_agents_pydantic_ai reads the running agent (tested with pydantic-ai 2.78)"
        )
    return getter


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the running PydanticAI agent's name, or None
    outside an agent run (or for an agent with no name). Registered by `install`."""
    context = _run_context_getter()()
    agent = getattr(context, "agent", None)
    name = getattr(agent, "name", None)
    if not isinstance(name, str) or not name:
        return None
    return Attribution(agent=name)


def install() -> None:
    """Label every captured call made inside a PydanticAI agent run with the agent's `name` (the
    name given to `Agent(name=...)`, or the variable name PydanticAI infers at the first run).
    Process-wide and idempotent; an explicit `tito_agents.agent(...)` scope still wins. Refuses
    a pydantic-ai release without the run context it reads (`ConfigurationError`)."""
    _run_context_getter()
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
