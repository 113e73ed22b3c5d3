"""The collector: the one object a user configures. It wraps clients, opens episodes, assembles
samples when episodes end and hands them to the sink.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from os import PathLike
from typing import Any, TypeVar
from urllib.parse import urlsplit

from tito_agents import _transport
from tito_agents._capture import CaptureCore, ErrorPolicy, OutsideEpisode
from tito_agents.assembly import AssemblyMode, AssemblyOptions, EpisodeContext, assemble_episode
from tito_agents.calls import Call, CallStatus
from tito_agents.episodes import Episode
from tito_agents.errors import ConfigurationError, EpisodeCaptureError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import BufferedSink, ExportStats, MemorySink, Sink

logger = logging.getLogger("tito_agents")

ClientT = TypeVar("ClientT")

DEFAULT_EPISODE_ID = "default"
_OPENAI_HOSTS = frozenset({"api.openai.com"})


class SinkErrors(enum.Enum):
    """What a sink failure does when the collector hands samples over."""

    LOG = "log"
    """Default: logged once and counted (`CaptureStats.sink_failures`, `lost_samples`); the
    episode's exit and the agent's calls go on."""
    RAISE = "raise"
    """Strict: the episode's exit raises the `SinkError` (after capture errors are settled).
    Calls outside any episode still never raise: their samples are queued, not written there."""


@dataclass(slots=True)
class CaptureStats:
    """Counters over the collector's lifetime (read them; do not write them)."""

    requests: int = 0
    """Captured requests sent (each retry attempt counts)."""
    failed_attempts: int = 0
    """Attempts that got no 2xx response (the SDK may have retried them): never calls."""
    skipped_requests: int = 0
    """Requests to vLLM hosts not captured (non-JSON body, or the caller set return_token_ids=false)."""
    complete_calls: int = 0
    unusable_calls: int = 0
    incomplete_calls: int = 0
    duplicate_calls: int = 0
    late_calls: int = 0
    """Calls that completed after their episode had ended: never samples."""
    episodes: int = 0
    failed_episodes: int = 0
    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    sink_failures: int = 0
    """Hand-offs of samples to the sink that failed (each logged once)."""
    lost_samples: int = 0
    """Samples of those failed hand-offs: assembled but not accepted by the sink."""
    delivery: ExportStats | None = None
    """What the buffer in front of the sink did after accepting samples (retries, spills,
    refusals; `tito_agents.sinks.ExportStats`); None while no buffer is in use."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Collector:
    """Captures calls to vLLM, scopes them to episodes, writes samples to a sink.

    sink: a `Sink`, or a path / URL for `open_sink` (`samples.jsonl`, `out/samples.parquet`,
        `redis://host/0?stream=samples`, `ray://queue`, ...); None keeps samples in memory
        (`collector.sink.samples`). A path or URL is always opened behind a `BufferedSink`
        (bounded buffer, retry, spill to ``$TITO_SPILL_DIR`` or ``~/.cache/tito-agents/spill``),
        so a slow or failing disk or server never stalls or breaks the agent. A `Sink` object is
        used as given; samples of calls outside any episode are still never written from inside
        the agent's call: they go through a buffer of the collector's own.
    sink_errors: what a sink failure does (`SinkErrors`; "log" by default, "raise" is strict).
    capture_logprobs: also ask vLLM for the logprob of each sampled token (unless the caller set
        `logprobs` itself); off by default, since it costs the server and the wire.
    errors: what a capture problem does (`ErrorPolicy`; "episode" by default).
    outside_episode: what a call outside any episode does (`OutsideEpisode`; "default").
    keep_messages: keep each request's chat messages on its `Call` (memory only, never persisted).
    policy_version: a label of the weights that sample now (async RL); set it again on each update.
    end_of_turn_id: the model's end-of-turn token for token-in sessions; learnt from the first turn
        that ends on EOS when not given (needed earlier only to bridge a truncated first turn).
    assembly: `AssemblyMode` or its string: "per_call" (one sample per call), "merged" (an agent's
        calls merged into one sequence wherever each prompt extends the previous one; see
        `tito_agents.assembly.merged`) or "both" (both kinds to the same sink; train on one of them).
    turn_discount: discount of per-call rewards inside a merged sample.
    tokenizer: optional, e.g. a transformers tokenizer of the served model; only used to name
        divergences and show excerpts in reports, never to make token ids.
    """

    def __init__(
        self,
        sink: Sink | str | PathLike[str] | None = None,
        *,
        capture_logprobs: bool = False,
        errors: ErrorPolicy | str = ErrorPolicy.EPISODE,
        sink_errors: SinkErrors | str = SinkErrors.LOG,
        outside_episode: OutsideEpisode | str = OutsideEpisode.DEFAULT,
        keep_messages: bool = True,
        policy_version: str | None = None,
        end_of_turn_id: int | None = None,
        assembly: AssemblyMode | str = AssemblyMode.PER_CALL,
        turn_discount: float = 1.0,
        tokenizer: Any = None,
    ) -> None:
        if sink is None:
            sink = MemorySink()
        elif not isinstance(sink, Sink):
            from tito_agents.sinks.registry import open_sink

            sink = open_sink(sink, buffered=True)
        self.sink: Sink = sink
        self._queue: BufferedSink | None = sink if isinstance(sink, BufferedSink) else None
        """Where samples of calls outside any episode go (never written inside the call)."""
        self.capture_logprobs = capture_logprobs
        self.error_policy = ErrorPolicy(errors)
        self.sink_errors = SinkErrors(sink_errors)
        self.outside_episode = OutsideEpisode(outside_episode)
        self.keep_messages = keep_messages
        self.policy_version = policy_version
        self.end_of_turn_id = end_of_turn_id
        self.learned_end_of_turn: dict[str, int] = {}
        """End-of-turn ids seen per model by token-in sessions, shared with later episodes."""
        self.verified_tails: dict[tuple[Any, ...], int | None] = {}
        """Tail shapes whose prefix preservation token-in sessions have checked (all episodes),
        with how their short render is cut (`sessions.Session.verified`)."""
        try:
            self.assembly = AssemblyMode(assembly)
        except ValueError:
            raise ConfigurationError(
                f"assembly must be per_call, merged or both, not {assembly!r}"
            ) from None
        self.turn_discount = turn_discount
        self.tokenizer = tokenizer
        self.stats = CaptureStats(delivery=self._queue.stats if self._queue else None)
        self._lock = threading.Lock()
        self._closed = False
        self.default_episode = Episode(self, DEFAULT_EPISODE_ID)

    # ---- set-up ----

    def wrap(
        self, client: ClientT, *, vllm_hosts: Iterable[str] | None = None, sessions: bool = False
    ) -> ClientT:
        """Capture every call of an existing `openai.OpenAI` / `AsyncOpenAI` client (in place).

        `vllm_hosts` lists the hosts ("host" or "host:port") that run vLLM; by default the host of
        the client's `base_url`. Only those hosts get vLLM-only fields; the official OpenAI API is
        never marked. `sessions=True` turns on token-in sessions for chat calls of this client
        (see `tito_agents.sessions`; an episode can override it). Returns the same client.
        """
        http_client = getattr(client, "_client", None)
        base_url = getattr(client, "base_url", None)
        if http_client is None or base_url is None:
            raise ConfigurationError(
                f"wrap() expects an openai.OpenAI or openai.AsyncOpenAI client, got "
                f"{type(client).__name__}"
            )
        hosts = self._hosts(vllm_hosts, str(base_url))
        _transport.install(http_client, CaptureCore(self, hosts, sessions=sessions))
        return client

    def http_client(
        self,
        vllm_hosts: Iterable[str],
        *,
        asynchronous: bool = True,
        sessions: bool = False,
        **kwargs: Any,
    ) -> Any:
        """A new httpx client (the library the installed openai uses) that captures calls to
        `vllm_hosts`; for frameworks that accept an `http_client` / `http_async_client`."""
        import openai

        cls = openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient
        client = cls(**kwargs)
        core = CaptureCore(self, self._hosts(vllm_hosts, None), sessions=sessions)
        _transport.install(client, core)
        return client

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
                f"{sorted(refused)} is the official OpenAI API, which rejects vLLM-only fields and "
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
            self,
            episode_id,
            task_id=task_id,
            group_id=group_id,
            agent=agent,
            metadata=metadata,
            sessions=sessions,
        )

    def assemble(self, episode: Episode, calls: list[Call]) -> list[Sample]:
        """The samples of an ended episode, in the collector's assembly mode. Divergences found
        while merging are kept on `episode.divergences` and counted in `episode.report`."""
        # Built per episode, not once: `tokenizer` and `turn_discount` are public attributes.
        options = AssemblyOptions.from_tokenizer(self.tokenizer, self.assembly, self.turn_discount)
        context = EpisodeContext(
            episode_id=episode.episode_id,
            episode_reward=episode.reward,
            task_id=episode.task_id,
            group_id=episode.group_id,
            metadata=dict(episode.metadata) if episode.metadata else None,
        )
        samples, divergences = assemble_episode(calls, context, options)
        episode.divergences.extend(divergences)
        for divergence in divergences:
            kind = divergence.kind.value
            episode.report.divergences[kind] = episode.report.divergences.get(kind, 0) + 1
        return samples

    def _end(self, episode: Episode, failed: bool) -> list[Sample]:
        calls = episode.close_calls()
        with self._lock:
            self.stats.episodes += 1
            if failed:
                self.stats.failed_episodes += 1
        if failed:
            return []
        samples = self.assemble(episode, calls)
        self._count_samples(episode, samples)
        return samples

    def _count_samples(self, episode: Episode, samples: list[Sample]) -> None:
        tokens = trained = 0
        for sample in samples:
            tokens += sample.num_tokens
            trained += sample.num_trained
        report = episode.report
        report.samples += len(samples)
        report.tokens += tokens
        report.trained_tokens += trained
        with self._lock:
            self.stats.samples += len(samples)
            self.stats.tokens += tokens
            self.stats.trained_tokens += trained

    def _raise_errors(self, episode: Episode, failed: bool, sink_error: SinkError | None) -> None:
        if failed:
            return
        if episode.errors and self.error_policy is ErrorPolicy.EPISODE:
            raise EpisodeCaptureError(episode.episode_id, list(episode.errors))
        if sink_error is not None and self.sink_errors is SinkErrors.RAISE:
            raise sink_error

    def finish_episode(self, episode: Episode, *, failed: bool) -> None:
        """Called by `Episode.__exit__`: hand the samples to the sink, then raise capture errors
        if any (and, with `sink_errors="raise"`, a sink failure)."""
        samples = self._end(episode, failed)
        sink_error: SinkError | None = None
        if samples:
            try:
                self.sink.write(samples)
            except Exception as exc:
                sink_error = self._sink_failed(samples, exc)
        self._raise_errors(episode, failed, sink_error)

    async def afinish_episode(self, episode: Episode, *, failed: bool) -> None:
        """Async twin of `finish_episode`."""
        samples = self._end(episode, failed)
        sink_error: SinkError | None = None
        if samples:
            try:
                await self.sink.awrite(samples)
            except Exception as exc:
                sink_error = self._sink_failed(samples, exc)
        self._raise_errors(episode, failed, sink_error)

    def _sink_failed(self, samples: list[Sample], exc: Exception) -> SinkError:
        """Count and log a failed hand-off once; the error to raise in strict mode."""
        with self._lock:
            self.stats.sink_failures += 1
            self.stats.lost_samples += len(samples)
        logger.error(
            "%r refused %d samples (%s: %s); counted in collector.stats.lost_samples",
            self.sink,
            len(samples),
            type(exc).__name__,
            exc,
        )
        if isinstance(exc, SinkError):
            return exc
        error = SinkError(f"{self.sink!r}: {type(exc).__name__}: {exc}", retryable=False)
        error.__cause__ = exc
        return error

    def _queue_outside_episode(self, samples: list[Sample]) -> None:
        """Samples of calls outside any episode, from inside the agent's call: queued, never
        written here, and no failure gets out (the agent's call must return its response)."""
        try:
            if isinstance(self.sink, MemorySink):  # a list append: nothing to queue
                self.sink.write(samples)
                return
            if self._queue is None:
                with self._lock:
                    if self._queue is None:
                        self._queue = BufferedSink(self.sink, name=repr(self.sink), linger=0.0)
                        self.stats.delivery = self._queue.stats
            self._queue.write_nowait(samples)
        except Exception as exc:
            self._sink_failed(samples, exc)

    # ---- called by the capture core ----

    def on_calls_recorded(self, episode: Episode, calls: list[Call], added: int) -> None:
        """Count recorded calls; calls outside any episode become samples right away."""
        with self._lock:
            stats = self.stats
            if added == 0 and episode.closed:
                stats.late_calls += len(calls)
                return
            stats.duplicate_calls += len(calls) - added
            for call in calls:
                if call.status is CallStatus.COMPLETE:
                    stats.complete_calls += 1
                elif call.status is CallStatus.UNUSABLE:
                    stats.unusable_calls += 1
                else:
                    stats.incomplete_calls += 1
        if episode is self.default_episode and added:
            try:
                samples = self.assemble(episode, calls)
            except Exception:  # a defect, not a reason to fail the agent's call
                logger.exception("assembling calls outside any episode failed")
                samples = []
            if samples:
                self._count_samples(episode, samples)
                self._queue_outside_episode(samples)
            with episode._lock:  # the default episode keeps no history: memory stays bounded
                episode.calls.clear()
                episode.errors.clear()
                episode._call_ids.clear()

    # ---- lifetime ----

    def flush(self) -> None:
        """Return once every sample handed over so far is in the sink (delivered, for a buffered
        one) and the sink is flushed."""
        if self._queue is not None and self._queue is not self.sink:
            self._queue.flush()
        self.sink.flush()

    def close(self) -> None:
        """Deliver what is queued, then close the sink. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._queue is not self.sink:
            self._queue.close()  # delivers what is queued, then closes the sink it wraps
            return
        self.sink.close()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._queue is not self.sink:
            await self._queue.aclose()
            return
        await self.sink.aclose()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Collector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
