"""Which CrewAI agent is making a request, and the capture of a CrewAI LLM's own clients.

CrewAI keeps no context of the running agent. Every task a crew runs, sequential or
hierarchical, a delegated coworker's included (the manager calls it inside its own task), goes
through `Agent.execute_task` or `Agent.aexecute_task`; `install` wraps both so the task runs in a
scope naming the agent (`role`), which a resolver reads when capture sends the request: a
coworker's scope is the innermost, so its calls carry its own role. CrewAI copies the context
into the thread it runs a task with a time limit in, so those are named too.

CrewAI's native OpenAI-compatible LLMs (`LLM(model="openai/..." or "hosted_vllm/...")`) build an
`OpenAI` and an `AsyncOpenAI` from one set of arguments, so no one `http_client` fits both:
`wrap_llm` wraps the two clients the LLM built. Neither those clients nor the task methods are
documented API: `install` and `wrap_llm` accept only the releases they are tested on.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents import Collector
from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "CrewAI"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_CREWAI = ">=1.15,<1.16"
"""The CrewAI releases whose task methods and LLM clients are tested (1.15.44); others are
refused."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_crewai_running", default=None
)
_ORIGINALS: dict[str, Callable[..., Any]] = {}
LLMT = TypeVar("LLMT")


def check_crewai_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed CrewAI's) is one of them."""
    if version is None:
        version = importlib.metadata.version("crewai")
    try:
        supported = SpecifierSet(SUPPORTED_CREWAI).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"CrewAI {version} is not supported by tito-agents-crewai: it reads the running agent "
            f"around CrewAI's task methods and wraps its LLMs' own clients, which are no "
            f"documented API; supported: CrewAI {SUPPORTED_CREWAI} "
            f"(pip install 'crewai{SUPPORTED_CREWAI}')"
        )


def wrap_llm(collector: Collector, llm: LLMT) -> LLMT:
    """Capture every call of a CrewAI OpenAI-compatible `llm` (its sync and async clients, in
    place); returns `llm`. An LLM CrewAI routes through LiteLLM has no such clients:
    `ConfigurationError`, naming LiteLLM's fix."""
    check_crewai_version()
    getters = [getattr(llm, name, None) for name in ("_get_sync_client", "_get_async_client")]
    if not all(callable(getter) for getter in getters):
        raise ConfigurationError(
            f"{type(llm).__name__} builds no openai client of its own (CrewAI calls LiteLLM for "
            "it): capture it with tito_agents_litellm.install(collector, vllm_hosts=[...])"
        )
    for getter in getters:
        assert callable(getter)
        collector.wrap(getter())
    return llm


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the CrewAI agent whose task is running (its
    `role`), or None outside one. Registered by `install`."""
    role = _RUNNING.get()
    return None if role is None else Attribution(agent=role)


def _role(agent: Any) -> str | None:
    role = getattr(agent, "role", None)
    return role if isinstance(role, str) and role else None


def _named(execute: Callable[..., Any]) -> Callable[..., Any]:
    """`execute` with `_RUNNING` naming its agent while it runs."""

    @functools.wraps(execute)
    def named(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _RUNNING.set(_role(self))
        try:
            return execute(self, *args, **kwargs)
        finally:
            _RUNNING.reset(token)

    return named


def _anamed(
    execute: Callable[..., Coroutine[Any, Any, Any]],
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """The coroutine `execute` with `_RUNNING` naming its agent while it runs."""

    @functools.wraps(execute)
    async def named(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _RUNNING.set(_role(self))
        try:
            return await execute(self, *args, **kwargs)
        finally:
            _RUNNING.reset(token)

    return named


def _agent_class() -> Any:
    """CrewAI's `Agent` (imported here: this package imports without CrewAI)."""
    return importlib.import_module("crewai").Agent


def install() -> None:
    """Label every captured call a CrewAI agent makes in a crew's task with its `role` (a
    delegated coworker's with its own). Process-wide and idempotent; an explicit
    `tito_agents.agent(...)` scope still wins. Refuses a release outside `SUPPORTED_CREWAI`
    (`ConfigurationError`)."""
    check_crewai_version()
    agent = _agent_class()
    if not _ORIGINALS:
        _ORIGINALS["execute_task"] = agent.execute_task
        _ORIGINALS["aexecute_task"] = agent.aexecute_task
        agent.execute_task = _named(agent.execute_task)
        agent.aexecute_task = _anamed(agent.aexecute_task)
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
    if _ORIGINALS:
        agent = _agent_class()
        for name, method in _ORIGINALS.items():
            setattr(agent, name, method)
        _ORIGINALS.clear()
