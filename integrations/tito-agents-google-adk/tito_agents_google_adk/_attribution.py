"""Which Google ADK agent is making a request: the agent ADK labels each model request with.

ADK keeps no context of the running agent, but before every model call it labels the request
with the agent's name (`llm_request.config.labels["adk_agent_name"]`, for per-agent billing; a
sub-agent an agent transferred to, or one run as another's `AgentTool`, labels its own). `install`
wraps `LiteLlm.generate_content_async`, the model that reaches vLLM, so each step of its response
stream runs in a scope naming that agent, read by a resolver when capture sends the request. The
scope is set and reset around each step rather than held across the generator's yields, so a
stream closed from another context never resets a variable it did not set. The label and the
wrapped method are no documented contract: `install` accepts only the releases it is tested on.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.metadata
from collections.abc import AsyncIterator, Callable
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents.errors import ConfigurationError
from tito_agents.integration import Attribution, register_resolver, unregister_resolver

FRAMEWORK = "Google ADK"
"""How this integration names its framework to the core (the fix its warnings name)."""

SUPPORTED_ADK = ">=2.15,<2.16"
"""The google-adk releases whose model-request label is tested (2.15.0); others are refused."""

AGENT_LABEL = "adk_agent_name"
"""The label ADK puts on each model request: the name of the agent making it."""

_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agents_google_adk_running", default=None
)
_ORIGINAL: list[Callable[..., AsyncIterator[Any]]] = []


def check_adk_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed google-adk's) is one of them."""
    if version is None:
        version = importlib.metadata.version("google-adk")
    try:
        supported = SpecifierSet(SUPPORTED_ADK).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"google-adk {version} is not supported by tito-agents-google-adk: it reads the agent "
            f"from ADK's model-request label and wraps LiteLlm, which are no documented contract; "
            f"supported: google-adk {SUPPORTED_ADK} (pip install 'google-adk{SUPPORTED_ADK}')"
        )


def agent_of(llm_request: Any) -> str | None:
    """The agent ADK labelled `llm_request` with, or None (no label, or not a name)."""
    labels = getattr(getattr(llm_request, "config", None), "labels", None) or {}
    name = labels.get(AGENT_LABEL)
    return name if isinstance(name, str) and name else None


def resolve_agent() -> Attribution | None:
    """The attribution of a request sent now: the ADK agent whose model call is stepping, or
    None outside one. Registered by `install`."""
    name = _RUNNING.get()
    return None if name is None else Attribution(agent=name)


def _named(
    generate: Callable[..., AsyncIterator[Any]],
) -> Callable[..., AsyncIterator[Any]]:
    """`generate` with `_RUNNING` naming its request's agent during each step of its stream."""

    @functools.wraps(generate)
    async def named(self: Any, llm_request: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        name = agent_of(llm_request)
        responses = generate(self, llm_request, *args, **kwargs).__aiter__()
        while True:
            token = _RUNNING.set(name)
            try:
                response = await anext(responses)
            except StopAsyncIteration:
                return
            finally:
                _RUNNING.reset(token)
            yield response

    return named


def _lite_llm() -> Any:
    """ADK's `LiteLlm` class (imported here: this package imports without google-adk)."""
    return importlib.import_module("google.adk.models.lite_llm").LiteLlm


def install() -> None:
    """Label every captured call an ADK agent makes through `LiteLlm` with the agent's `name` (a
    sub-agent's with its own). Process-wide and idempotent; an explicit `tito_agents.agent(...)`
    scope still wins. Refuses a release outside `SUPPORTED_ADK` (`ConfigurationError`)."""
    check_adk_version()
    lite_llm = _lite_llm()
    if not _ORIGINAL:
        _ORIGINAL.append(lite_llm.generate_content_async)
        lite_llm.generate_content_async = _named(lite_llm.generate_content_async)
    register_resolver(resolve_agent)


def uninstall() -> None:
    """Undo `install` (no error if it was not installed)."""
    unregister_resolver(resolve_agent)
    if _ORIGINAL:
        _lite_llm().generate_content_async = _ORIGINAL.pop()
