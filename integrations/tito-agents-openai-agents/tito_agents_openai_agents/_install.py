"""`install`: one call that makes the Agents SDK's model calls go through a capturing client, on
the chat-completions path, with every call labelled with its agent.

Capture itself is the core's: the integration wraps the `AsyncOpenAI` client with
`collector.wrap` and tells the SDK to use it. Why chat completions: vLLM returns
`prompt_token_ids` / `token_ids` only there; the SDK's default model (`OpenAIResponsesModel`) calls
the Responses API, whose vLLM responses carry no ids, and the SDK's `ModelResponse` keeps none.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from agents import (
    Model,
    ModelProvider,
    OpenAIChatCompletionsModel,
    RunConfig,
    set_default_openai_api,
    set_default_openai_client,
)
from agents.tracing import add_trace_processor, set_trace_processors
from openai import AsyncOpenAI

import tito_agents.integration
from tito_agents import Collector, ConfigurationError
from tito_agents_openai_agents._attribution import TRACKER, resolve_agent, with_agent_labels
from tito_agents_openai_agents._spans import AgentSpanTracker
from tito_agents_openai_agents._stats import STATS, AgentsStats, Uncaptured, set_policy

_REGISTRATION = threading.Lock()
_processor_added = False


class TitoModelProvider(ModelProvider):
    """A `ModelProvider` for `RunConfig(model_provider=...)`: every model name resolves to an
    `OpenAIChatCompletionsModel` on one (wrapped) client. Unlike the SDK's default provider it
    never reads "prefix/" in a name as a provider, so vLLM names like "org/model" work."""

    def __init__(self, client: AsyncOpenAI, *, default_model: str | None = None) -> None:
        self.client = client
        self.default_model = default_model

    def get_model(self, model_name: str | None) -> Model:
        name = model_name or self.default_model
        if not name:
            raise ConfigurationError(
                "an agent has no model name: give Agent(model=...) or install(..., model=...)"
            )
        return OpenAIChatCompletionsModel(model=name, openai_client=self.client)


class AgentsCapture:
    """What `install` set up: the wrapped client, a provider on it, and run configs that label
    model calls when tracing is off.

    `client` is the `AsyncOpenAI` every captured call goes through; `provider` resolves model names
    to chat-completions models on it; `processor` is the tracing processor that names agents
    (include it if you call `agents.set_trace_processors` yourself); `stats` counts labels and
    uncaptured calls (process-wide).
    """

    def __init__(
        self,
        collector: Collector,
        client: AsyncOpenAI,
        *,
        default_model: str | None,
        uncaptured: Uncaptured,
        owns_client: bool,
    ) -> None:
        self.collector = collector
        self.client = client
        self.provider = TitoModelProvider(client, default_model=default_model)
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
        labels each call with its agent, composed with `base`'s own filter. Needed when tracing is
        disabled; harmless when it is on."""
        config = base if base is not None else RunConfig()
        config = with_agent_labels(config, uncaptured=self.uncaptured)
        if use_provider:
            config.model_provider = self.provider
        return config

    async def aclose(self) -> None:
        """Close the client if `install` created it (from `base_url`); a given client is yours."""
        if self._owns_client:
            await self.client.close()


def _register(replace_trace_processors: bool) -> None:
    """Register the span map with the SDK's tracing and the resolver with the core, once."""
    global _processor_added
    with _REGISTRATION:
        if replace_trace_processors:
            set_trace_processors([TRACKER])
            _processor_added = True
        elif not _processor_added:
            add_trace_processor(TRACKER)
            _processor_added = True
    tito_agents.integration.register_resolver(resolve_agent)


def install(
    collector: Collector,
    client: AsyncOpenAI | None = None,
    *,
    base_url: str | None = None,
    api_key: str = "EMPTY",
    vllm_hosts: Iterable[str] | None = None,
    model: str | None = None,
    set_default: bool = True,
    replace_trace_processors: bool = False,
    uncaptured: Uncaptured = "error",
) -> AgentsCapture:
    """Capture every Agents SDK model call with `collector`, labelled with its agent.

    client / base_url: the `AsyncOpenAI` to capture (wrapped in place), or the vLLM URL to build one
        for. Exactly one is required.
    vllm_hosts: hosts that run vLLM (default: the client's host); see `Collector.wrap`.
    model: the model name for agents that name none (used by `capture.provider`).
    set_default: make the client the SDK's default (`set_default_openai_client(...,
        use_for_tracing=False)`) and select chat completions (`set_default_openai_api`), so agents
        with string model names need nothing else. False: touch no SDK default; pass
        `run_config=capture.run_config()` to each run instead.
    replace_trace_processors: make the span map the SDK's only tracing processor, which also stops
        trace export to OpenAI (the usual reason to disable tracing with vLLM) while agent labels
        keep working. False adds it beside the existing processors.
    uncaptured: what a model call that escapes capture does ("error" or "count", see `Uncaptured`).

    Calling it again (another collector or client) re-points the defaults; the span map and the
    resolver are registered once per process.
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
    _register(replace_trace_processors)
    if set_default:
        set_default_openai_client(client, use_for_tracing=False)
        set_default_openai_api("chat_completions")
    return AgentsCapture(
        collector, client, default_model=model, uncaptured=uncaptured, owns_client=owns_client
    )
