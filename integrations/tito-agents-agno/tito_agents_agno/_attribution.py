"""Which Agno agent or team is making a request: the run output Agno hands its model.

Agno keeps no context of the running agent; what it does give every model request is the run's
output (`RunOutput.agent_name`, `TeamRunOutput.team_name`), passed as `run_response` to the
model's `response`, `aresponse`, `response_stream` and `aresponse_stream`. `install` wraps those
four methods of `agno.models.base.Model` so each runs inside a scope naming that agent, which a
resolver reads when capture sends the request. A member agent a team delegates to runs its own
model call inside the team's, so its scope is the innermost and its calls carry its own name.
These methods are no public API: `install` accepts only the Agno releases it is tested on.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.metadata
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "Agno"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_AGNO = ">=3.1,<3.2"
"""The agno releases the wrapped model methods are tested on (3.1.10); others are refused."""

_METHODS = ("response", "aresponse", "response_stream", "aresponse_stream")
_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_agno_running", default=None
)
_ORIGINALS: dict[str, Any] = {}


def check_agno_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed agno's) is one of them."""
    if version is None:
        version = importlib.metadata.version("agno")
    try:
        supported = SpecifierSet(SUPPORTED_AGNO).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"agno {version} is not supported by tito-agents-agno: it reads the running agent "
            f"from Agno's model methods, which are no public API; supported: agno "
            f"{SUPPORTED_AGNO} (pip install 'agno{SUPPORTED_AGNO}')"
        )


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the Agno agent (or team) whose model call is
    running, or None outside one. Registered by `install`."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


def _runner_name(
    method: Callable[..., Any], args: tuple[Any, ...], kw: dict[str, Any]
) -> str | None:
    """The name on the call's `run_response`: an agent's or a team's; None without one."""
    run = kw.get("run_response")
    if run is None and args:
        bound = inspect.signature(method).bind_partial(None, *args, **kw)
        run = bound.arguments.get("run_response")
    name = getattr(run, "agent_name", None) or getattr(run, "team_name", None)
    return name if isinstance(name, str) and name else None


def _named(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` run with `_RUNNING` set to the name of its run, for the four kinds of method."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def agen(self: Any, *args: Any, **kw: Any) -> AsyncIterator[Any]:
            token = _RUNNING.set(_runner_name(method, args, kw))
            try:
                async for item in method(self, *args, **kw):
                    yield item
            finally:
                _RUNNING.reset(token)

        return agen
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def gen(self: Any, *args: Any, **kw: Any) -> Iterator[Any]:
            token = _RUNNING.set(_runner_name(method, args, kw))
            try:
                yield from method(self, *args, **kw)
            finally:
                _RUNNING.reset(token)

        return gen
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def coro(self: Any, *args: Any, **kw: Any) -> Any:
            token = _RUNNING.set(_runner_name(method, args, kw))
            try:
                return await method(self, *args, **kw)
            finally:
                _RUNNING.reset(token)

        return coro

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kw: Any) -> Any:
        token = _RUNNING.set(_runner_name(method, args, kw))
        try:
            return method(self, *args, **kw)
        finally:
            _RUNNING.reset(token)

    return call


def install() -> None:
    """Label every captured call an Agno agent or team makes with its `name` (a team's member
    with the member's). Process-wide and idempotent; an explicit `tito_agents.agent(...)` scope
    still wins. Refuses an agno release outside `SUPPORTED_AGNO` (`ConfigurationError`)."""
    check_agno_version()
    from agno.models.base import Model

    if not _ORIGINALS:
        for name in _METHODS:
            original = getattr(Model, name)
            _ORIGINALS[name] = original
            setattr(Model, name, _named(original))
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
    if _ORIGINALS:
        from agno.models.base import Model

        for name, original in _ORIGINALS.items():
            setattr(Model, name, original)
        _ORIGINALS.clear()
