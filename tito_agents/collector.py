"""The collector: the one object a user configures. It wraps clients, opens episodes, assembles
samples when episodes end and hands them to the sink.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Iterable, Mapping
from os import PathLike
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from tito_agents._capture import CaptureCore
from tito_agents._capture import transport as _transport
from tito_agents._http import is_http_client
from tito_agents.config import (
    AssemblyMode,
    CollectorSettings,
    CollectorStats,
    ErrorMode,
    OutsideEpisodeMode,
    Policies,
    SessionHistoryMode,
    SinkErrorMode,
    VersionLabel,
    parse_policy_versions,
    parse_version_label,
)
from tito_agents.episodes import Episode
from tito_agents.errors import ConfigurationError
from tito_agents.export import SampleProcessor
from tito_agents.sampling import ServerSampling
from tito_agents.sinks import BufferedSink, MemorySink, Sink

__all__ = ["Collector", "CollectorSettings", "CollectorStats"]

logger = logging.getLogger("tito_agents")

ClientT = TypeVar("ClientT")

HttpLibrary = Literal["openai", "httpx", "httpx2"]
"""The client classes `Collector.http_client` builds: the openai SDK's own, or a plain httpx or
httpx2 one."""

DEFAULT_EPISODE_ID = "default"
_OPENAI_HOSTS = frozenset({"api.openai.com", "api.anthropic.com"})
"""The official APIs: never vLLM hosts (they reject vLLM-only fields and return no ids)."""


class Collector:
    """Captures calls to vLLM, scopes them to episodes, writes samples to a sink.

    Configuration and wiring only: the stages are `CaptureCore` (per wrapped client, reading
    `settings`), `Episode` (attribution), `SampleProcessor` (assembly and the sink), each
    reporting to the next. Everything set here is read back, and may be changed later, on
    `settings` (one `CollectorSettings`): a change applies from the next request or episode.

    sink: a `Sink`, or a path / URL for `open_sink` (`samples.jsonl`, `out/samples.parquet`,
        `redis://host/0?stream=samples`, `ray://queue`, ...; `?partition_by=policy` writes a file
        or stream per policy, `tito_agents.sinks.partition`); None keeps samples in memory
        (a `MemorySink`; tests read it with `tito_agents.testing.captured_samples(collector)`).
        A path or URL is always opened behind a `BufferedSink`
        (bounded buffer, retry, spill under ``$TITO_CACHE_DIR/spill``, made only if it spills),
        so a slow or failing disk or server never stalls or breaks the agent. A `Sink` object is
        used as given (written where episodes end); samples of calls outside any episode are
        assembled and written by the processor's thread, never inside the agent's call.
    sink_errors: what a sink failure does (`SinkErrorMode`; "log" by default, "raise" is strict).
    capture_logprobs: also ask vLLM for the logprob of each sampled token (unless the caller set
        `logprobs` itself); off by default, since it costs the server and the wire.
    errors: what a capture problem does (`ErrorMode`; "episode" by default).
    outside_episode: what a call outside any episode does (`OutsideEpisodeMode`; "default").
    keep_messages: keep each request's chat messages on its `Call` (in memory; persisted only with
        `record_messages=True`).
    policy_version: a label of the weights that sample now (async RL); set it again on each update.
        A string, or an int (a step number), stored as its decimal string.
    policies: one policy per agent (docs/policies.md): agent name -> the model / LoRA adapter name
        its calls are sent to (`{"planner": "planner-lora"}`), or a hook `(agent, labels) -> name
        or None`. A routed request's `model` is set to that name (spliced into the caller's bytes;
        the mapping wins over the model the caller named), on vLLM hosts only; other agents' calls
        go as written. Calls and samples carry the name (`Call.policy`, `calls.policy_of`).
    policy_versions: the weights' label per policy (`{"planner-lora": "3"}`); a policy not listed
        takes `policy_version`. Set entries on `settings.policy_versions` on each update.
    end_of_turn_id: the model's end-of-turn token for token-in sessions; when not given, derived
        from the server's own chat template at a session's first append (once per server and
        model). Give it only to override what the template says.
    session_history: what token-in sessions do where the chat template would re-render the
        history differently (templates that drop past reasoning): "template" (default) falls back
        to server rendering with the reason and the fix; "sampled" keeps the model's own sampled
        tokens in context and renders only the new messages (`SessionHistoryMode`).
    rescore_constrained: recover the policy's own logprobs of calls sampled under a constraint
        (forced tool choice, structured output): vLLM returns the logprobs of the grammar-masked
        distribution there. At each episode's end, those calls' ids are re-scored by the same
        server (`/v1/completions`, token prompt, `prompt_logprobs`), batched, off the agent's
        calls; stored as `Sample.policy_logprobs` beside the rollout `logprobs`
        (`tito_agents.rescore`). Responses API calls that asked for logprobs and came back without
        one for every sampled id (vLLM 0.32 gives none for function-call and reasoning tokens, nor
        a stream's EOS) are re-scored too. Off by default: it costs one server pass per such call.
    assembly: `AssemblyMode` or its string: "per_call" (one sample per call), "merged" (an agent's
        calls merged into one sequence wherever each prompt extends the previous one; see
        `tito_agents.assembly.merged`) or "both" (both kinds to the same sink; train on one of them).
    turn_discount: discount of per-call rewards inside a merged sample.
    record_messages: also write each chat call's request messages and tools into its samples
        (`metadata["call_messages"]`), for `tito-agents drift --chat-template`; off by default
        (they repeat the conversation in every call and hold user data).
    tokenizer: optional, e.g. a transformers tokenizer of the served model; only used to name
        divergences and show excerpts in reports, never to make token ids.
    logprobs_mode: the server's `--logprobs-mode` ("raw_logprobs", vLLM's default, or
        "processed_logprobs"; `tito_agents.sampling.probe_logprobs_mode` tells it), recorded on
        every span so a trainer knows whether the logprobs are those of the distribution that
        sampled; None: unknown.
    sampling_defaults: the sampling values the server applies to fields a request leaves out
        (its model's generation_config, e.g. `{"temperature": 0.6, "top_p": 0.95}`; none with
        `--generation-config vllm`); spans then say "declared". Both are kept on
        `settings.server_sampling`.
    """

    def __init__(
        self,
        sink: Sink | str | PathLike[str] | None = None,
        *,
        capture_logprobs: bool = False,
        errors: ErrorMode | str = ErrorMode.EPISODE,
        sink_errors: SinkErrorMode | str = SinkErrorMode.LOG,
        outside_episode: OutsideEpisodeMode | str = OutsideEpisodeMode.DEFAULT,
        keep_messages: bool = True,
        policy_version: VersionLabel = None,
        policies: Policies | None = None,
        policy_versions: Mapping[str, VersionLabel] | None = None,
        end_of_turn_id: int | None = None,
        session_history: SessionHistoryMode | str = SessionHistoryMode.TEMPLATE,
        rescore_constrained: bool = False,
        assembly: AssemblyMode | str = AssemblyMode.PER_CALL,
        turn_discount: float = 1.0,
        tokenizer: Any = None,
        record_messages: bool = False,
        logprobs_mode: str | None = None,
        sampling_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if sink is None:
            sink = MemorySink()
        elif not isinstance(sink, Sink):
            from tito_agents.sinks.registry import open_sink

            sink = open_sink(sink, buffered=True)
        try:
            mode = AssemblyMode(assembly)
        except ValueError:
            raise ConfigurationError(
                f"assembly must be per_call, merged or both, not {assembly!r}"
            ) from None
        self.sink: Sink = sink
        self.settings = CollectorSettings(
            capture_logprobs=capture_logprobs,
            errors=ErrorMode(errors),
            outside_episode=OutsideEpisodeMode(outside_episode),
            keep_messages=keep_messages,
            end_of_turn_id=end_of_turn_id,
            session_history=SessionHistoryMode(session_history),
            rescore_constrained=rescore_constrained,
            sink_errors=SinkErrorMode(sink_errors),
            assembly=mode,
            turn_discount=turn_discount,
            tokenizer=tokenizer,
            record_messages=record_messages,
            server_sampling=_server_sampling(logprobs_mode, sampling_defaults),
        )
        """Everything set here, in one object: read by every wrapped client on each request and
        by the processor at each episode's end, so a change applies from the next one
        (`collector.settings.policy_version = "v8"` after a weight update)."""
        try:  # parsed and checked as they are stored
            self.settings.policies = policies or {}
            self.settings.policy_version = parse_version_label(policy_version)
            self.settings.policy_versions = parse_policy_versions(policy_versions)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.stats = CollectorStats(delivery=sink.stats if isinstance(sink, BufferedSink) else None)
        self._processor = SampleProcessor(sink, stats=self.stats, settings=self.settings)
        self.default_episode = Episode(
            self._processor, self.settings, DEFAULT_EPISODE_ID, outside=True
        )
        """Where calls outside any episode go (`outside_episode="default"`); keeps no history."""
        self._closed = False

    # ---- set-up ----

    def wrap(
        self, client: ClientT, *, vllm_hosts: Iterable[str] | None = None, sessions: bool = False
    ) -> ClientT:
        """Capture every call of an existing `openai.OpenAI` / `AsyncOpenAI` client (in place), or
        of an `anthropic.Anthropic` / `AsyncAnthropic` one (its Messages calls: docs/anthropic.md),
        or of an `httpx` / `httpx2` client itself (one a framework built and keeps, as LiteLLM's
        handlers do; `vllm_hosts` is then required).

        `vllm_hosts` lists the hosts ("host" or "host:port") that run vLLM; by default the host of
        the client's `base_url`. Only those hosts get vLLM-only fields; the official OpenAI and
        Anthropic APIs are never marked. `sessions=True` turns on token-in sessions for chat calls
        of this client (see `tito_agents.sessions`; an episode can override it). Returns the same
        client.
        """
        if is_http_client(client):
            _transport.install(client, self._core(self._hosts(vllm_hosts, None), sessions))
            return client
        http_client = getattr(client, "_client", None)
        base_url = getattr(client, "base_url", None)
        if http_client is None or base_url is None:
            raise ConfigurationError(
                "wrap() expects an openai.OpenAI / AsyncOpenAI or anthropic.Anthropic / "
                f"AsyncAnthropic client, got {type(client).__name__}"
            )
        hosts = self._hosts(vllm_hosts, str(base_url))
        _transport.install(http_client, self._core(hosts, sessions))
        return client

    def http_client(
        self,
        vllm_hosts: Iterable[str],
        *,
        asynchronous: bool = True,
        sessions: bool = False,
        library: HttpLibrary = "openai",
        **kwargs: Any,
    ) -> Any:
        """A new HTTP client that captures calls to `vllm_hosts`, for frameworks that accept an
        `http_client` / `http_async_client`; `kwargs` go to the client's constructor.

        library: which client class. "openai" (default): the openai SDK's own
        (`openai.DefaultAsyncHttpxClient` / `DefaultHttpxClient`, on httpx2 with openai >= 3, on
        httpx before), what an openai client built by the framework expects. "httpx": a plain
        `httpx.AsyncClient` / `httpx.Client`, for frameworks that check
        `isinstance(http_client, httpx.AsyncClient)` (Agno), which an openai >= 3 client (httpx2)
        fails. "httpx2": a plain `httpx2` client. The capture is the same in each.
        """
        cls = _client_class(library, asynchronous)
        client = cls(**kwargs)
        _transport.install(client, self._core(self._hosts(vllm_hosts, None), sessions))
        return client

    def _core(self, hosts: frozenset[str], sessions: bool) -> CaptureCore:
        return CaptureCore(
            self.settings,
            self.default_episode,
            self.stats,
            hosts,
            sessions=sessions,
        )

    @staticmethod
    def _hosts(vllm_hosts: Iterable[str] | None, base_url: str | None) -> frozenset[str]:
        if vllm_hosts is None:
            if base_url is None:
                raise ConfigurationError("vllm_hosts is required")
            parts = urlsplit(base_url)
            host = parts.hostname or ""
            hosts = {host} if parts.port is None else {f"{host}:{parts.port}"}
        else:
            hosts = {h.strip().lower() for h in vllm_hosts if h.strip()}
        refused = {h for h in hosts if h.split(":")[0] in _OPENAI_HOSTS}
        if refused:
            raise ConfigurationError(
                f"{sorted(refused)} is the official OpenAI API (or Anthropic's), which rejects "
                "vLLM-only fields and "
                "returns no token ids; point the client at your vLLM server"
            )
        if not hosts:
            raise ConfigurationError("no vLLM host to capture")
        return frozenset(hosts)

    # ---- episodes ----

    def episode(
        self,
        episode_id: str | None = None,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        sessions: bool | None = None,
    ) -> Episode:
        """A context manager (`with` or `async with`) scoping the calls of one rollout.

        `sessions` turns token-in sessions on or off for this episode (None: as the client says).
        """
        if self._closed:
            raise ConfigurationError("the collector is closed")
        return Episode(
            self._processor,
            self.settings,
            episode_id,
            task_id=task_id,
            group_id=group_id,
            agent=agent,
            metadata=metadata,
            sessions=sessions,
        )

    # ---- lifetime ----

    def flush(self) -> None:
        """Return once every sample handed over so far is in the sink (delivered, for a buffered
        one) and the sink is flushed."""
        self._processor.flush()

    def close(self) -> None:
        """Write what is queued, then close the sink. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._processor.stop()
        self.sink.close()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._processor.stop)
        await self.sink.aclose()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Collector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _client_class(library: HttpLibrary, asynchronous: bool) -> type[Any]:
    """The client class `Collector.http_client` builds for `library`."""
    if library == "openai":
        import openai

        return openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient
    if library not in ("httpx", "httpx2"):
        raise ConfigurationError(f"library must be openai, httpx or httpx2, not {library!r}")
    try:
        module = importlib.import_module(library)
    except ImportError:
        raise ConfigurationError(
            f"library={library!r}: {library} is not installed (pip install {library})"
        ) from None
    cls: type[Any] = module.AsyncClient if asynchronous else module.Client
    return cls


def _server_sampling(
    logprobs_mode: str | None, defaults: Mapping[str, Any] | None
) -> ServerSampling | None:
    if logprobs_mode is None and defaults is None:
        return None
    try:
        return ServerSampling(dict(defaults or {}), logprobs_mode, declared=defaults is not None)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
