"""Which smolagents agent is making a request: the agent whose run is stepping.

smolagents keeps no context of the running agent. Every run, streamed or not and a managed
agent's included (the manager calls it as a tool, inside its own step), goes through
`MultiStepAgent._run_stream`, the generator that takes the agent's steps and so makes its model
calls. `install` wraps it so the steps run inside a scope naming the agent (`name`), which a
resolver reads when capture sends the request: a managed agent's scope is the innermost, so its
calls carry its own name. smolagents copies the caller's context into the threads it runs
parallel tool calls in, so a managed agent run there is named (and in its episode) too.
`_run_stream` is no public API: `install` accepts only the releases it is tested on.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.metadata
from collections.abc import Callable, Iterator
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "smolagents"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_SMOLAGENTS = ">=1.26,<1.27"
"""The smolagents releases the wrapped run method is tested on (1.26.0); others are refused."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_smolagents_running", default=None
)
_ORIGINAL: list[Callable[..., Iterator[Any]]] = []


def check_smolagents_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed smolagents') is one of them."""
    if version is None:
        version = importlib.metadata.version("smolagents")
    try:
        supported = SpecifierSet(SUPPORTED_SMOLAGENTS).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"smolagents {version} is not supported by tito-agents-smolagents: it reads the "
            f"running agent from smolagents' run loop, which is no public API; supported: "
            f"smolagents {SUPPORTED_SMOLAGENTS} (pip install 'smolagents{SUPPORTED_SMOLAGENTS}')"
        )


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the smolagents agent whose run is stepping (its
    `name`), or None outside one or for an agent with no name. Registered by `install`."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


def _named(run_stream: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """`run_stream` with `_RUNNING` set to its agent's name while it steps."""

    @functools.wraps(run_stream)
    def named(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        name = getattr(self, "name", None)
        token = _RUNNING.set(name if isinstance(name, str) and name else None)
        try:
            yield from run_stream(self, *args, **kwargs)
        finally:
            _RUNNING.reset(token)

    return named


def install() -> None:
    """Label every captured call a smolagents agent makes with its `name` (a managed agent's
    with its own). Process-wide and idempotent; an explicit `tito_agents.agent(...)` scope
    still wins. Refuses a release outside `SUPPORTED_SMOLAGENTS` (`ConfigurationError`)."""
    check_smolagents_version()
    from smolagents.agents import MultiStepAgent  # type: ignore[import-untyped]

    if not _ORIGINAL:
        _ORIGINAL.append(MultiStepAgent._run_stream)
        MultiStepAgent._run_stream = _named(MultiStepAgent._run_stream)
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
    if _ORIGINAL:
        from smolagents.agents import MultiStepAgent

        MultiStepAgent._run_stream = _ORIGINAL.pop()
