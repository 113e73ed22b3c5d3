"""Which AutoGen agent is making a request: the `AssistantAgent` whose turn is running.

AutoGen keeps no context of the running agent outside its runtime (a team's agents run in
containers whose ids are not the agents' names, and `agent.run()` has no runtime at all). Every
turn of an `AssistantAgent`, alone or in a team, streamed or not, goes through its
`on_messages_stream`, the generator that calls the model client. `install` wraps it so the turn
runs inside a scope naming the agent (`name`), which a resolver reads when capture sends the
request. The method is public but its role as every turn's path is not promised: `install`
accepts only the AutoGen releases it is tested on.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.metadata
from collections.abc import AsyncIterator, Callable
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "AutoGen"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_AUTOGEN = ">=0.7.5,<0.8"
"""The autogen-agentchat releases the wrapped turn is tested on (0.7.5); others are refused."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_autogen_running", default=None
)
_ORIGINAL: list[Callable[..., AsyncIterator[Any]]] = []


def check_autogen_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed autogen-agentchat's) is one of them."""
    if version is None:
        version = importlib.metadata.version("autogen-agentchat")
    try:
        supported = SpecifierSet(SUPPORTED_AUTOGEN).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"autogen-agentchat {version} is not supported by tito-agents-autogen: it reads the "
            f"running agent from AssistantAgent.on_messages_stream; supported: autogen-agentchat "
            f"{SUPPORTED_AUTOGEN} (pip install 'autogen-agentchat{SUPPORTED_AUTOGEN}')"
        )


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the AutoGen agent whose turn is running, or None
    outside one. Registered by `install`."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


def _named(turn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """`turn` with `_RUNNING` set to its agent's name while it runs."""

    @functools.wraps(turn)
    async def named(self: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        name = getattr(self, "name", None)
        token = _RUNNING.set(name if isinstance(name, str) and name else None)
        try:
            async for item in turn(self, *args, **kwargs):
                yield item
        finally:
            _RUNNING.reset(token)

    return named


def install() -> None:
    """Label every captured call an AutoGen `AssistantAgent` makes with its `name`, alone or in
    a team. Process-wide and idempotent; an explicit `tito_agents.agent(...)` scope still wins.
    Refuses a release outside `SUPPORTED_AUTOGEN` (`ConfigurationError`)."""
    check_autogen_version()
    from autogen_agentchat.agents import AssistantAgent

    if not _ORIGINAL:
        _ORIGINAL.append(AssistantAgent.on_messages_stream)
        AssistantAgent.on_messages_stream = _named(AssistantAgent.on_messages_stream)  # type: ignore[method-assign, assignment]
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
    if _ORIGINAL:
        from autogen_agentchat.agents import AssistantAgent

        AssistantAgent.on_messages_stream = _ORIGINAL.pop()  # type: ignore[method-assign, assignment]
