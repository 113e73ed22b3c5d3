"""Which LlamaIndex agent is making a request: the workflow agent whose step is running.

LlamaIndex keeps no context of the running agent that outlives a step. Every model call of its
workflow agents (`FunctionAgent`, `ReActAgent`, `CodeActAgent`), run alone or in an
`AgentWorkflow` of several, is made inside the agent's `take_step`, streamed responses read
there too. `install` wraps `take_step` of those three classes so each step runs inside a scope
naming the agent (`name`), which a resolver reads when capture sends the request. `take_step`
is no promised hook: `install` accepts only the llama-index-core releases it is tested on.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.metadata
from collections.abc import Awaitable, Callable
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "LlamaIndex"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_LLAMA_INDEX = ">=0.14.25,<0.15"
"""The llama-index-core releases the wrapped step is tested on (0.14.25); others are refused."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_llamaindex_running", default=None
)
_ORIGINALS: dict[type[Any], Callable[..., Awaitable[Any]]] = {}


def check_llama_index_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed llama-index-core's) is one of them."""
    if version is None:
        version = importlib.metadata.version("llama-index-core")
    try:
        supported = SpecifierSet(SUPPORTED_LLAMA_INDEX).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"llama-index-core {version} is not supported by tito-agents-llamaindex: it reads the "
            f"running agent from its agents' take_step; supported: llama-index-core "
            f"{SUPPORTED_LLAMA_INDEX} (pip install 'llama-index-core{SUPPORTED_LLAMA_INDEX}')"
        )


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the LlamaIndex agent whose step is running, or
    None outside one. Registered by `install`."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


def _named(step: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`step` with `_RUNNING` set to its agent's name while it runs."""

    @functools.wraps(step)
    async def named(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self, "name", None)
        token = _RUNNING.set(name if isinstance(name, str) and name else None)
        try:
            return await step(self, *args, **kwargs)
        finally:
            _RUNNING.reset(token)

    return named


def _agent_classes() -> tuple[type[Any], ...]:
    from llama_index.core.agent.workflow import CodeActAgent, FunctionAgent, ReActAgent

    return FunctionAgent, ReActAgent, CodeActAgent


def install() -> None:
    """Label every captured call a LlamaIndex workflow agent makes with its `name`, alone or in
    an `AgentWorkflow`. Process-wide and idempotent; an explicit `tito_agents.agent(...)` scope
    still wins. Refuses a release outside `SUPPORTED_LLAMA_INDEX` (`ConfigurationError`)."""
    check_llama_index_version()
    if not _ORIGINALS:
        for cls in _agent_classes():
            _ORIGINALS[cls] = cls.take_step
            cls.take_step = _named(cls.take_step)
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
    for cls, original in _ORIGINALS.items():
        cls.take_step = original
    _ORIGINALS.clear()
