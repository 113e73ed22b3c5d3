"""Which DSPy program is making a request: the innermost module of the user's own on DSPy's
stack of calling modules.

DSPy keeps the modules a call runs inside (`dspy.settings.caller_modules`, outermost first) in
its context-local settings: every `Module.__call__` and `acall` pushes its module for the span of
its `forward`, sync or async, so the stack read when capture sends the request is the stack of
the call that made it. A program's agents are its own modules (`class Researcher(dspy.Module)`),
built from DSPy's (`ChainOfThought`, `Predict`): the innermost module whose class is not DSPy's
names the call, so a sub-program's calls carry its own name; a program of DSPy's modules only (a
bare `dspy.ReAct`) is named by its outermost. `caller_modules` is no documented API: `install`
accepts only the releases it is tested on.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "DSPy"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_DSPY = ">=3.4,<3.5"
"""The DSPy releases whose calling-module stack is tested (3.4.1); others are refused."""


def check_dspy_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed DSPy's) is one of them."""
    if version is None:
        version = importlib.metadata.version("dspy")
    try:
        supported = SpecifierSet(SUPPORTED_DSPY).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"DSPy {version} is not supported by tito-agents-dspy: it reads DSPy's stack of "
            f"calling modules, which is no documented API; supported: DSPy {SUPPORTED_DSPY} "
            f"(pip install 'dspy{SUPPORTED_DSPY}')"
        )


def agent_of(modules: Sequence[Any]) -> str | None:
    """The agent name of a call made inside `modules` (outermost first): the class name of the
    innermost module defined outside DSPy, else of the outermost; None outside any module."""
    if not modules:
        return None
    own = [m for m in modules if not type(m).__module__.startswith("dspy.")]
    return type(own[-1] if own else modules[0]).__name__


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the DSPy program module it runs in (`agent_of`),
    or None outside one. Registered by `install`."""
    import dspy  # type: ignore[import-untyped]

    name = agent_of(dspy.settings.caller_modules or ())
    return None if name is None else Attribution(agent=name)


def install() -> None:
    """Label every captured call a DSPy program makes with its module's class name (a
    sub-program's with its own). Process-wide and idempotent; an explicit
    `tito_agents.agent(...)` scope still wins. Refuses a release outside `SUPPORTED_DSPY`
    (`ConfigurationError`)."""
    check_dspy_version()
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
