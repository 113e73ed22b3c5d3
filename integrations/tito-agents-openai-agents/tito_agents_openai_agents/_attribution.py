"""Agent attribution at request time: the resolver the capture core calls for every captured
request, and the run config's model-input filter that labels model calls when tracing is off.

Two sources, the first that knows wins:

1. Tracing (on by default): the SDK's current span is the call's generation span; the span map
   (`AgentSpanTracker`) names the agent that owns it.
2. `RunConfig.call_model_input_filter`: the SDK calls it in the run's own task immediately before
   each model call, so a contextvar set there is what the request sees. It never leaks into the
   caller: the SDK runs each turn (or the whole streamed run) in a task of its own.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Awaitable
from typing import Any

from agents import (
    Agent,
    Model,
    ModelProvider,
    MultiProvider,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    OpenAIResponsesModel,
    RunConfig,
)
from agents.run_config import CallModelData, CallModelInputFilter, ModelInputData
from agents.tracing import get_current_span

from tito_agents.integration import Attribution, captures, register_resolver
from tito_agents_openai_agents._providers import DefaultModelProvider, TitoModelProvider
from tito_agents_openai_agents._spans import AgentSpanTracker
from tito_agents_openai_agents._stats import STATS, logger, record_uncaptured

TRACKER = AgentSpanTracker()
"""The process's one span map; `install` registers it with the SDK's tracing."""

_FILTER_AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_openai_agents_agent", default=None
)
_warned_untracked = False


def resolve_agent() -> Attribution | None:
    """The agent making the request being sent now (registered with `tito_agents.register_resolver`).

    Labels also carry `agent_path` (the chain of agents, for agents run as tools) and
    `agents_trace_id` (to join with SDK traces) when tracing named the agent.
    """
    span = get_current_span()
    if span is not None:
        owner = TRACKER.claim(span.span_id)
        if owner is not None:
            STATS.count_label(by_span=True)
            return Attribution(
                agent=owner.name,
                labels={"agent_path": owner.path, "agents_trace_id": owner.trace_id},
            )
    if span is not None and span.span_id != "no-op" and not TRACKER.is_tracked(span.span_id):
        _warn_untracked()
    name = _FILTER_AGENT.get()
    if name is None:
        return None
    STATS.count_label(by_span=False)
    return Attribution(agent=name)


def _warn_untracked() -> None:
    """A request inside a live SDK span the span map never saw: the processor is not registered."""
    global _warned_untracked
    if not _warned_untracked:
        _warned_untracked = True
        logger.warning(
            "a captured request ran inside an Agents SDK span that tito's span map does not know "
            "(no agent_path, no detection of uncaptured calls from tracing); if you call "
            "agents.set_trace_processors(...), include capture.processor"
        )


def _resolved_model(agent: Agent[Any], run_config: RunConfig) -> Model | None:
    """The model the SDK will use for `agent` (its own rule), when that is knowable up front."""
    if isinstance(run_config.model, Model):
        return run_config.model
    name: str | None
    if isinstance(run_config.model, str):
        name = run_config.model
    elif isinstance(agent.model, Model):
        return agent.model
    else:
        name = agent.model
    provider: ModelProvider = run_config.model_provider
    # Only known providers are asked again: they build the model without I/O (tito's may read the
    # server's model list once, which the SDK's own call right after needs anyway).
    if isinstance(provider, DefaultModelProvider) and name is not None:
        provider = provider.inner
    if not isinstance(
        provider, MultiProvider | OpenAIProvider | TitoModelProvider | DefaultModelProvider
    ):
        return None
    try:
        return provider.get_model(name)
    except Exception:  # the SDK raises its own, clearer error right after this filter
        return None


def _unwrapped_client_url(model: Model | None) -> str | None:
    """The base URL of an OpenAI model's client when tito does not capture it, else None."""
    if not isinstance(model, OpenAIChatCompletionsModel | OpenAIResponsesModel):
        return None
    client = getattr(model, "_client", None)
    if client is None or captures(client):
        return None
    return str(client.base_url)


def _spans_will_see_it() -> bool:
    """Whether tito's span map will see the coming model call (tracing on, processor registered):
    it then reports an uncaptured call itself, when the call's span ends."""
    span = get_current_span()
    return span is not None and TRACKER.is_tracked(span.span_id)


class AgentLabelFilter:
    """A `call_model_input_filter`: labels the coming model call with its agent, reports a model
    on an unwrapped client by name (when tracing will not), then runs the user's own filter."""

    def __init__(
        self,
        run_config: RunConfig,
        inner: CallModelInputFilter | None,
    ) -> None:
        self.run_config = run_config
        self.inner = inner

    def __call__(self, data: CallModelData[Any]) -> ModelInputData | Awaitable[ModelInputData]:
        agent = data.agent
        model = _resolved_model(agent, self.run_config)
        unwrapped = _unwrapped_client_url(model)
        if unwrapped is not None and not _spans_will_see_it():
            kind = "response" if isinstance(model, OpenAIResponsesModel) else "generation"
            record_uncaptured(agent.name, kind, unwrapped)
        _FILTER_AGENT.set(agent.name)  # in the run's task, just before the model call
        if self.inner is None:
            return data.model_data
        return self.inner(data)


def with_agent_labels(run_config: RunConfig) -> RunConfig:
    """A copy of `run_config` whose model-input filter labels every model call with its agent,
    composed with the filter it already had (applying it twice keeps one label filter)."""
    register_resolver(resolve_agent)  # idempotent: the filter's labels need it
    config = dataclasses.replace(run_config)
    inner = run_config.call_model_input_filter
    if isinstance(inner, AgentLabelFilter):
        inner = inner.inner
    config.call_model_input_filter = AgentLabelFilter(config, inner)
    return config
