"""Episodes: attributing every captured call to the rollout, task, group and agent that made it.

Attribution is carried by contextvars, read by the transport when a request is sent. asyncio tasks
copy the context when they are created, so 1,000 concurrent episodes in one loop never mix calls.
Raw threads do not copy it: `bind(fn)` and `ContextThreadPoolExecutor` carry it across.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar

from tito_agents._values import as_text
from tito_agents.assembly import Divergence, EpisodeContext
from tito_agents.calls import Call, CallStatus, count_calls
from tito_agents.config import CollectorSettings, EmptyEpisodeCause
from tito_agents.errors import CaptureError, EpisodeNotEndedError, EpisodeStateError
from tito_agents.export import EndedEpisode, ExportResult, RecordedCalls
from tito_agents.samples import Sample, finite_or_none

logger = logging.getLogger("tito_agents")

P = ParamSpec("P")
R = TypeVar("R")

_CURRENT_EPISODE: contextvars.ContextVar[Episode | None] = contextvars.ContextVar(
    "tito_episode", default=None
)
_CURRENT_AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tito_agent", default=None
)
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_CURRENT_LABELS: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "tito_labels", default=_EMPTY
)


@dataclass(frozen=True, slots=True)
class Attribution:
    """What a framework adapter knows about the code making a request: its episode, agent, labels.

    Returned by resolvers registered with `register_resolver`; any field may be left empty.
    """

    episode: Episode | None = None
    agent: str | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)


Resolver = Callable[[], "Attribution | None"]
_RESOLVERS: list[Resolver] = []


def register_resolver(resolver: Resolver) -> None:
    """Add a resolver the capture layer calls when each request is sent (in the caller's context).

    Integrations use it to read their framework's own context (LangGraph node, Agents SDK span).
    Explicit `episode()` / `agent()` / `labels()` scopes win over what resolvers say. Idempotent.
    """
    if resolver not in _RESOLVERS:
        _RESOLVERS.append(resolver)


def unregister_resolver(resolver: Resolver) -> None:
    """Remove a resolver added with `register_resolver` (no error if it is not registered)."""
    if resolver in _RESOLVERS:
        _RESOLVERS.remove(resolver)


def resolve_attribution() -> tuple[Episode | None, str | None, Mapping[str, Any]]:
    """Episode, agent and labels for a request sent now: explicit scopes first, then resolvers."""
    episode = _CURRENT_EPISODE.get()
    agent_name = _CURRENT_AGENT.get()
    found = _CURRENT_LABELS.get()
    if not _RESOLVERS:
        return episode, agent_name, found
    merged: dict[str, Any] = {}
    for resolver in list(_RESOLVERS):
        try:
            result = resolver()
        except Exception:  # a resolver must never break the agent's call
            logger.exception("attribution resolver %r failed", resolver)
            continue
        if result is None:
            continue
        if episode is None:
            episode = result.episode
        if agent_name is None:
            agent_name = result.agent
        merged.update(result.labels)
    merged.update(found)
    return episode, agent_name, MappingProxyType(merged)


def current_episode() -> Episode | None:
    """The episode the calling code runs in, or None."""
    return _CURRENT_EPISODE.get()


def current_agent() -> str | None:
    """The agent label set by `agent(...)` (or an integration) in the calling context."""
    return _CURRENT_AGENT.get()


def current_labels() -> Mapping[str, Any]:
    """Extra labels (run ids, graph nodes, ...) set in the calling context."""
    return _CURRENT_LABELS.get()


@contextlib.contextmanager
def agent(name: str | None) -> Iterator[None]:
    """Label every call made inside the block with agent `name` (nests; the innermost wins). An
    int name is written as its string (`as_text`)."""
    token = _CURRENT_AGENT.set(as_text(name, "agent"))
    try:
        yield
    finally:
        _CURRENT_AGENT.reset(token)


@contextlib.contextmanager
def labels(**values: Any) -> Iterator[None]:
    """Add labels to every call made inside the block (merged over the enclosing labels)."""
    merged = MappingProxyType({**_CURRENT_LABELS.get(), **values})
    token = _CURRENT_LABELS.set(merged)
    try:
        yield
    finally:
        _CURRENT_LABELS.reset(token)


def bind(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap `fn` so it runs in a copy of the current context (episode, agent, labels), wherever
    it is called: a raw thread, `loop.run_in_executor`, a `ThreadPoolExecutor`."""
    snapshot = contextvars.copy_context()

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return snapshot.copy().run(fn, *args, **kwargs)

    return run


class ContextThreadPoolExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose tasks run in the context of the code that submitted them."""

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        context = contextvars.copy_context()

        def run() -> R:
            return context.run(fn, *args, **kwargs)

        return super().submit(run)


@dataclass(slots=True)
class EpisodeReport:
    """What happened in an episode, for logs and for the user's own accounting."""

    episode_id: str
    calls: int = 0
    """Calls recorded in the episode: `complete + incomplete + unusable` (`calls.CallCounts`)."""
    complete: int = 0
    incomplete: int = 0
    """Calls whose response started but never finished (cut, failed mid-stream, abandoned)."""
    unusable: int = 0
    in_flight: int = 0
    """Calls still in flight when the episode ended (no response yet): not among `calls`, never
    samples of this episode (`CollectorStats.late_calls` if they finish later)."""
    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    divergences: dict[str, int] = field(default_factory=dict)
    """Merged assembly: how many times each kind of divergence split a sample."""
    errors: list[str] = field(default_factory=list)
    empty_cause: EmptyEpisodeCause | None = None
    """Why it ended with no captured call (logged with the fix), or None when it has calls."""
    bypassed_calls: int = 0
    """Model calls its framework made beyond the captured requests it sent
    (`Episode.note_model_call`; logged with the fix)."""


class EpisodeProcessor(Protocol):
    """Where an episode reports what happens to it: the next stage of the pipeline (the
    collector's `export.SampleProcessor`), as a tracer's span processor hears of ended spans. An
    episode knows this protocol, never the collector; it hands over frozen records and keeps what
    comes back, so the processor never reads or writes the episode itself."""

    def on_calls(self, recorded: RecordedCalls) -> None:
        """Calls were recorded on an episode. Runs on the request path: it must not block or
        raise."""

    def on_end(self, episode: EndedEpisode) -> ExportResult:
        """The episode ended: its samples, handed to the sink, and what its end raises."""

    async def aon_end(self, episode: EndedEpisode) -> ExportResult:
        """`on_end` for `async with`: never blocks the event loop."""


class Episode:
    """One rollout: a context manager (sync and async) that scopes captured calls.

    On exit the episode's complete calls become samples and go to the collector's sink. If some calls
    could not be captured exactly, the exit raises `EpisodeCaptureError` after writing the good ones
    (policy `ErrorMode.EPISODE`, the default). If the body raised, no samples are written: a
    rollout that crashed has no trustworthy reward; its calls stay readable on `calls`.

    After the exit, `samples` holds the samples the episode produced, in process, whatever the
    sink (see `samples`).

    outside: the collector's episode for calls outside any episode (`Collector.default_episode`):
    it keeps no calls (memory stays bounded however many it sees); each response's calls go to the
    processor's thread as they come.
    """

    def __init__(
        self,
        processor: EpisodeProcessor,
        settings: CollectorSettings,
        episode_id: str | None = None,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        sessions: bool | None = None,
        outside: bool = False,
    ) -> None:
        self._processor = processor
        self._outside = outside
        self._settings = settings
        self.outside_episode = settings.outside_episode
        """What the collector does with calls made outside any episode (adapters name it)."""
        self.sessions = sessions
        """Token-in sessions for this episode: True/False, or None to follow the wrapped client.
        The sessions themselves are capture state (`tito_agents._capture.session_store`)."""
        self.episode_id = as_text(episode_id, "episode_id") or uuid.uuid4().hex
        self.task_id = as_text(task_id, "task_id")
        self.group_id = as_text(group_id, "group_id")
        self.agent = as_text(agent, "agent")
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.reward: float | None = None
        self.started_at = time.time()
        """When the episode was opened (wall clock, like `Call.started_at`)."""
        self.empty_advice: str | None = None
        """What to tell the user if the episode ends with no captured call, where the usual
        advice (wrap the client) does not apply: the gateway says how to address its episodes."""
        self.calls: list[Call] = []
        self.errors: list[CaptureError] = []
        self.divergences: list[Divergence] = []
        """Where merged samples split, and why (filled when the episode ends in merged mode)."""
        self.report = EpisodeReport(self.episode_id)
        self._samples: list[Sample] | None = None
        self.closed = False
        """`end` has begun: calls are no longer added, a second end or a late reward is refused."""
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._call_ids: set[str] = set()
        self._inflight = 0
        self._requests = 0
        self._model_calls: dict[str, int] = {}
        self._token: contextvars.Token[Episode | None] | None = None

    # ---- rewards ----

    def set_reward(self, reward: float | None) -> None:
        """The episode's final reward (finite), given to every sample without a reward of its own.
        Before the end (after: `EpisodeStateError`, its samples are made)."""
        value = finite_or_none(reward)
        self._refuse_if_ended("set_reward()")
        self.reward = value

    def set_call_reward(self, target: Call | str | Any, reward: float | None) -> None:
        """A reward for one call: `target` is a `Call`, a call id, a response id (every choice of
        that response), or a response object with an `id` attribute. Before the end."""
        value = finite_or_none(reward)
        self._refuse_if_ended("set_call_reward()")
        if isinstance(target, Call):
            target.reward = value
            return
        key = target if isinstance(target, str) else getattr(target, "id", None)
        if not isinstance(key, str):
            raise TypeError(
                "target must be a Call, a call id, a response id or a response object with an "
                "`id` (for a stream, one of its chunks or `chunk.id`; for `with_raw_response`, "
                f"`raw.parse()`), got {type(target).__name__}"
            )
        matched = [c for c in self.calls if c.call_id == key or c.request_id == key]
        if not matched:
            raise KeyError(f"no captured call {key!r} in episode {self.episode_id!r}")
        for call in matched:
            call.reward = value

    def _refuse_if_ended(self, what: str) -> None:
        if self.closed:
            raise EpisodeStateError(
                f"{what} on episode {self.episode_id!r} after its end: an Episode is one rollout, "
                "ended once (rewards go inside its `with` block); open a new one with "
                "collector.episode()"
            )

    def add_error(self, error: CaptureError) -> None:
        """Record a capture problem found outside the transport (e.g. by an integration that saw a
        model call send no captured request); the episode exit reports it like the others."""
        with self._lock:
            self.errors.append(error)

    def note_model_call(self, framework: str) -> None:
        """A framework integration saw `framework` complete one model call in this episode. At the
        end, model calls beyond the captured requests the episode sent reached the model without
        capture (a client that bypassed it, a response cache): counted and logged with the fix,
        never silent. Note only calls that returned a response (a request that failed before
        it was sent is no miss)."""
        with self._lock:
            self._model_calls[framework] = self._model_calls.get(framework, 0) + 1

    @property
    def last_call(self) -> Call | None:
        """The most recently requested captured call (by request order)."""
        with self._lock:
            return max(self.calls, key=lambda c: (c.seq, c.choice_index), default=None)

    # ---- the capture-facing interface (`_capture.episode.CapturedEpisode`; not for user code) ----

    def call_started(self) -> int:
        """A request is about to be sent: counted in flight; returns its sequence number."""
        with self._lock:
            self._inflight += 1
            self._requests += 1
        return next(self._seq)

    def call_ended(self) -> None:
        """A request counted by `call_started` is no longer in flight."""
        with self._lock:
            self._inflight -= 1

    def add_calls(self, calls: list[Call]) -> int:
        """Record the calls of one response and report them to the processor. A call id already
        seen (a re-delivered response) is dropped; an ended episode adds none (a late call is
        never a sample). Returns how many were added."""
        with self._lock:
            late = self.closed
            added = 0 if late else self._keep_new(calls)
        outside = self._context() if self._outside and added else None
        self._processor.on_calls(RecordedCalls(tuple(calls), added, late=late, outside=outside))
        return added

    def _keep_new(self, calls: list[Call]) -> int:
        """Keep the calls whose id is new (with the lock); the outside episode keeps none."""
        if self._outside:
            return len(calls)
        added = 0
        for call in calls:
            if call.call_id in self._call_ids:
                continue
            self._call_ids.add(call.call_id)
            self.calls.append(call)
            if call.status is CallStatus.UNUSABLE and call.error is not None:
                self.errors.append(call.error)
            added += 1
        return added

    # ---- what the episode produced ----

    @property
    def samples(self) -> list[Sample]:
        """The samples this episode produced, once it has ended: what went to the sink, in the
        order written (per-call, then merged, with `assembly="both"`; `Sample.view` tells them
        apart). Kept in process whatever the sink (a file, Redis, ...), so a trainer's rollout
        function can hand them on directly. Also set when the sink refused them (counted in
        `collector.stats.lost_samples`).

        After `EpisodeCaptureError` (some calls not captured exactly): the good calls' samples.
        After a body that raised: empty (a crashed rollout has no samples). Before the end, or
        when assembling failed (the exit raised that error): `EpisodeNotEndedError`.
        """
        samples = self._samples
        if samples is None:
            if not self.closed:
                raise EpisodeNotEndedError(
                    f"episode {self.episode_id!r} has not ended: its samples are assembled when "
                    "the `with` block exits (or `end()` is called); read `samples` after that"
                )
            raise EpisodeNotEndedError(
                f"episode {self.episode_id!r} ended without samples: assembling them failed "
                "(its exit raised the error)"
            )
        return samples

    @property
    def settings(self) -> CollectorSettings:
        """The capture settings of the collector that opened this episode (read them; adapters
        key per-collector state on this object)."""
        return self._settings

    @property
    def inflight(self) -> int:
        return self._inflight

    # ---- scope ----

    def __enter__(self) -> Episode:
        with self._lock:  # entered once: nested or after its end, `EpisodeStateError`
            if self.closed:
                self._refuse_if_ended("a `with`")
            if self._token is not None:
                raise EpisodeStateError(f"episode {self.episode_id!r} is already entered")
            self._token = _CURRENT_EPISODE.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._reset()
        if not self.closed:  # ended in the body (an adapter's `end()`): not again, no error
            self.end(failed=exc is not None)

    async def __aenter__(self) -> Episode:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._reset()
        if not self.closed:
            await self.aend(failed=exc is not None)

    def end(self, *, failed: bool = False) -> None:
        """End the episode without `with` (adapters whose framework reports the end by callback):
        its samples go to the sink, then capture errors raise as on a `with` exit. Once."""
        self._keep(self._processor.on_end(self._close(failed)))

    async def aend(self, *, failed: bool = False) -> None:
        """`end` for coroutines."""
        self._keep(await self._processor.aon_end(self._close(failed)))

    def _close(self, failed: bool) -> EndedEpisode:
        """Freeze the episode: later calls are not added. Its calls are counted in the report and
        handed over as one frozen record."""
        with self._lock:
            if self.closed:
                self._refuse_if_ended("end()")
            self.closed = True
            calls = tuple(self.calls)
            counts = count_calls(calls)
            report = self.report
            report.calls = counts.calls
            report.complete, report.incomplete = counts.complete, counts.incomplete
            report.unusable, report.in_flight = counts.unusable, self._inflight
            report.errors = list(map(str, self.errors))
            return EndedEpisode(
                context=self._context(),
                calls=calls,
                errors=tuple(self.errors),
                failed=failed,
                in_flight=self._inflight,
                started_at=self.started_at,
                empty_advice=self.empty_advice,
                outside=self._outside,
                requests=self._requests,
                model_calls=MappingProxyType(dict(self._model_calls)),
            )

    def _keep(self, result: ExportResult) -> None:
        """Keep what the processor made of the ended episode, then raise what its end raises."""
        self._samples = list(result.samples)
        self.divergences.extend(result.divergences)
        report = self.report
        report.samples += len(result.samples)
        report.tokens += result.tokens
        report.trained_tokens += result.trained_tokens
        report.empty_cause = result.empty_cause
        report.bypassed_calls = result.bypassed_calls
        for divergence in result.divergences:
            kind = divergence.kind.value
            report.divergences[kind] = report.divergences.get(kind, 0) + 1
        if result.error is not None:
            raise result.error

    def _context(self) -> EpisodeContext:
        """What every sample of the episode carries, as it is now."""
        return EpisodeContext(
            episode_id=self.episode_id,
            episode_reward=self.reward,
            task_id=self.task_id,
            group_id=self.group_id,
            metadata=MappingProxyType(dict(self.metadata)) if self.metadata else None,
        )

    def _reset(self) -> None:
        """Leave the scope. An exit in another context than the entering one (an async generator
        closed in a task of its own, another thread) cannot restore it, yet must end the episode."""
        token, self._token = self._token, None
        if token is None:
            return
        try:
            _CURRENT_EPISODE.reset(token)
        except ValueError:  # "created in a different Context"
            logger.warning(
                "episode %r exited in another context than the one that entered it (an async "
                "generator closed by the event loop, or another thread); calls still made there "
                "count as late calls. Close generators where they run (contextlib.aclosing)",
                self.episode_id,
            )

    def __repr__(self) -> str:
        return f"Episode({self.episode_id!r}, calls={len(self.calls)}, reward={self.reward})"
