"""`install`: one call that makes the Agents SDK's model calls go through a capturing client,
with every call labelled with its agent.

Capture itself is the core's: the integration wraps the `AsyncOpenAI` client with
`collector.wrap` and tells the SDK to use it. The SDK's default model (`OpenAIResponsesModel`,
the Responses API) is captured as it is (vLLM returns the ids with `enable_response_messages`,
which capture adds); `api="chat_completions"` selects `OpenAIChatCompletionsModel` instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from agents import (
    RunConfig,
    set_default_openai_api,
    set_default_openai_client,
)
from agents.run import AgentRunner, get_default_agent_runner, set_default_agent_runner
from agents.tracing import TracingProcessor, get_trace_provider, set_trace_processors
from agents.tracing.processors import default_processor
from openai import AsyncOpenAI

import tito_agents.integration
from tito_agents import Collector, ConfigurationError
from tito_agents_openai_agents._attribution import TRACKER, resolve_agent, with_agent_labels
from tito_agents_openai_agents._providers import Api, DefaultModelProvider, TitoModelProvider
from tito_agents_openai_agents._runner import TitoAgentRunner
from tito_agents_openai_agents._spans import AgentSpanTracker
from tito_agents_openai_agents._stats import STATS, AgentsStats, Uncaptured, logger, set_policy

_REGISTRATION = threading.Lock()


class AgentsCapture:
    """What `install` set up: the wrapped client, a provider on it, and run configs that label
    model calls when tracing is off.

    `client` is the `AsyncOpenAI` every captured call goes through; `provider` resolves model names
    to models on it (Responses, or Chat Completions with `api="chat_completions"`); `processor` is
    the tracing processor that names agents (include it if you call `agents.set_trace_processors`
    yourself); `stats` counts labels and uncaptured calls (process-wide).
    """

    def __init__(
        self,
        collector: Collector,
        client: AsyncOpenAI,
        *,
        default_model: str | None,
        api: Api = "responses",
        uncaptured: Uncaptured,
        owns_client: bool,
    ) -> None:
        self.collector = collector
        self.client = client
        self.provider = TitoModelProvider(client, default_model=default_model, api=api)
        self.uncaptured: Uncaptured = uncaptured
        self._owns_client = owns_client

    @property
    def processor(self) -> AgentSpanTracker:
        return TRACKER

    @property
    def stats(self) -> AgentsStats:
        return STATS

    def run_config(self, base: RunConfig | None = None, *, use_provider: bool = True) -> RunConfig:
        """A `RunConfig` for `Runner.run*`: `base` (or a default one) with the capturing provider
        (unless `use_provider=False`, to keep `base.model_provider`) and a model-input filter that
        labels each call with its agent, composed with `base`'s own filter. Only needed with
        `install(..., set_default=False)`: otherwise every run gets it (see `complete`)."""
        config = base if base is not None else RunConfig()
        config = with_agent_labels(config)
        if use_provider:
            config.model_provider = self.provider
        return config

    def complete(self, given: Any) -> Any:
        """The run config the installed runner uses for a run given `given`: none → `run_config()`;
        a `RunConfig` keeps its own provider (agents naming no model get the installed model) and
        gets the label filter; a dict passes as given (the SDK coerces it)."""
        if given is None:
            return self.run_config()
        if not isinstance(given, RunConfig):
            return given
        config = with_agent_labels(given)
        if not isinstance(config.model_provider, TitoModelProvider | DefaultModelProvider):
            config.model_provider = DefaultModelProvider(config.model_provider, self.provider)
        return config

    async def aclose(self) -> None:
        """Close the client if `install` created it (from `base_url`); a given client is yours."""
        if self._owns_client:
            await self.client.close()


def _trace_processors() -> list[TracingProcessor]:
    """The SDK's registered tracing processors (it has no public getter; [] if unreadable)."""
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    return list(getattr(multi, "_processors", ()))


def _register(export_traces: bool | None) -> None:
    """Register the span map with the SDK's tracing, with the SDK's exporter to OpenAI kept
    (True), dropped (False) or left as it is (None); and the resolver with the core."""
    with _REGISTRATION:
        exporter = default_processor()
        current = _trace_processors()
        if export_traces is None:
            export_traces = exporter in current
        others = [p for p in current if p is not TRACKER and p is not exporter]
        set_trace_processors(([exporter] if export_traces else []) + others + [TRACKER])
    tito_agents.integration.register_resolver(resolve_agent)


def _install_runner(capture: AgentsCapture) -> None:
    """Make `Runner.run*` complete every run's config (see `_runner`), unless the user set a
    default runner of their own."""
    current = get_default_agent_runner()
    if type(current) is AgentRunner or isinstance(current, TitoAgentRunner):
        set_default_agent_runner(TitoAgentRunner(capture.complete))
    else:
        logger.warning(
            "a custom default AgentRunner (%s) is set: tito leaves it; pass "
            "run_config=capture.run_config() to each run",
            type(current).__name__,
        )


def install(
    collector: Collector,
    client: AsyncOpenAI | None = None,
    *,
    base_url: str | None = None,
    api_key: str = "EMPTY",
    vllm_hosts: Iterable[str] | None = None,
    model: str | None = None,
    api: Api = "responses",
    set_default: bool = True,
    export_traces: bool | None = None,
    uncaptured: Uncaptured = "error",
) -> AgentsCapture:
    """Capture every Agents SDK model call with `collector`, labelled with its agent.

    client / base_url: the `AsyncOpenAI` to capture (wrapped in place), or the vLLM URL to build one
        for. Exactly one is required.
    vllm_hosts: hosts that run vLLM (default: the client's host); see `Collector.wrap`.
    model: the model of agents that name none (default: the first model the server lists, read
        when first needed).
    api: "responses" (the SDK's default `OpenAIResponsesModel`, captured as it is) or
        "chat_completions" (`OpenAIChatCompletionsModel`); exact ids on both.
    set_default: make the client the SDK's default (`set_default_openai_client(...,
        use_for_tracing=False)`), select `api` (`set_default_openai_api`) and make
        `Runner.run` / `run_sync` / `run_streamed` use the capture's run config, so plain SDK code
        needs nothing else. False: touch no SDK default; pass `run_config=capture.run_config()` to
        each run instead.
    export_traces: keep the SDK's trace export to OpenAI (True) or drop it (False). Default
        (None): off when the client's host is a vLLM host (a vLLM key cannot upload traces; the
        SDK would retry and fail), left as it is otherwise. Agent labels come from tracing
        either way: tito's span map stays registered.
    uncaptured: what a model call that escapes capture does ("error" or "count", see `Uncaptured`).

    Calling it again (another collector or client) re-points the defaults.
    """
    if (client is None) == (base_url is None):
        raise ConfigurationError("install() needs exactly one of client= or base_url=")
    owns_client = client is None
    if client is None:
        client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    if not isinstance(client, AsyncOpenAI):
        raise ConfigurationError(
            f"install() expects an openai.AsyncOpenAI (the Agents SDK is async), got "
            f"{type(client).__name__}"
        )
    collector.wrap(client, vllm_hosts=vllm_hosts)
    set_policy(collector, uncaptured)
    if export_traces is None and tito_agents.integration.captures(client):
        export_traces = False
    _register(export_traces)
    capture = AgentsCapture(
        collector,
        client,
        default_model=model,
        api=api,
        uncaptured=uncaptured,
        owns_client=owns_client,
    )
    if set_default:
        set_default_openai_client(client, use_for_tracing=False)
        set_default_openai_api(api)
        _install_runner(capture)
    return capture
