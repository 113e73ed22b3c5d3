"""Export: the stage after episodes. Ended episodes become samples (assembly) and go to the sink;
failures are caught, logged once and counted, never thrown into the agent's calls.

The `SampleProcessor` is the `episodes.EpisodeProcessor` every episode reports to, in
OpenTelemetry's terms a processor: it hears of ended episodes (as a span processor hears of ended
spans) and enqueues their samples to the sink, which exports them (a `BufferedSink` delivers in a
thread of its own). Episode and processor exchange values, never each other: an episode hands over
frozen records (`RecordedCalls` as calls come, `EndedEpisode` at its end, OpenTelemetry's
`ReadableSpan`), and the processor answers an end with an `ExportResult` the episode keeps (its
samples and report) and raises from. Two paths:

* an episode's end (`on_end`, on the thread or event loop that exits it): assemble, count, hand
  the samples to the sink; the result says what the end raises (capture errors, and in the strict
  mode a sink failure);
* calls outside any episode (`on_calls` with `RecordedCalls.outside`, on the request path): only
  counted and queued there; one ``tito-processor`` thread (`_worker.Worker`) assembles and writes
  them, so neither assembly nor the sink ever runs inside the agent's HTTP call (in batches while
  they come often: `EXPORT_LINGER_S`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tito_agents import _frameworks, rescore
from tito_agents._worker import Worker, WorkSource
from tito_agents.assembly import AssemblyOptions, Divergence, EpisodeContext, assemble
from tito_agents.assembly.call_messages import attach_call_messages
from tito_agents.assembly.options import DEFAULT_OPTIONS
from tito_agents.calls import Call, CallStatus, count_calls
from tito_agents.config import (
    AssemblyMode,
    CollectorSettings,
    CollectorStats,
    EmptyEpisodeCause,
    ErrorMode,
    SinkErrorMode,
)
from tito_agents.errors import CaptureError, EpisodeCaptureError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import Sink, lifecycle

logger = logging.getLogger("tito_agents")

RECENT_OUTSIDE_CALLS = 1024
"""How many recent calls outside any episode are remembered (start time, agent) to explain an
episode that ends with none of its own."""

RECENT_EMPTY_GROUPS = 4096
"""How many groups' counts of empty episodes are remembered (the oldest group is forgotten
first): evidence that a response cache answered a group's repeated prompts."""

EXPORT_LINGER_S = 0.02
"""While calls outside any episode come more often than this (seconds), the processor's thread, once
woken, waits this long for more before it assembles them: one pass and one sink write for all of
them. Waking a thread costs more CPU than assembling a call (on the gateway, per-call wake-ups
were about a third of its capture overhead), so a busy agent or gateway pays it once per batch;
a lone call is written at once."""

EXPORT_BATCH_CALLS = 256
"""Queued calls that end the wait early (a batch is full)."""

MAX_QUEUED_CALLS = 65536
"""Calls outside any episode waiting for the processor's thread; beyond it they are counted as lost
(`CollectorStats.lost_samples`) rather than block the agent's call."""


@dataclass(frozen=True, slots=True)
class RecordedCalls:
    """The calls of one response as an episode recorded them: what the processor counts, and,
    outside any episode, what its thread assembles."""

    calls: tuple[Call, ...]
    """The calls of the response (one per choice), new or not."""
    added: int
    """How many were new to the episode; the others repeat a call id it had (a re-delivered
    response, counted in `CollectorStats.duplicate_calls`)."""
    late: bool = False
    """The episode had ended: none was added (`CollectorStats.late_calls`)."""
    outside: EpisodeContext | None = None
    """Set for calls outside any episode (the collector's default episode, which keeps none): the
    context the processor's thread assembles them in."""


@dataclass(frozen=True, slots=True)
class EndedEpisode:
    """An episode as it ended, frozen by the episode under its lock: everything the processor
    reads to make and judge its samples, so nothing done to the episode later (a late call, a
    reward) changes what is assembled, and the processor never holds the live episode."""

    context: EpisodeContext
    """What every sample of the episode carries: its id, reward, task, group and metadata."""
    calls: tuple[Call, ...]
    """Its calls (complete, incomplete and unusable), in the order recorded."""
    errors: tuple[CaptureError, ...] = ()
    """Its capture problems: what `ErrorMode.EPISODE` raises once the good calls' samples are
    written."""
    failed: bool = False
    """Its body raised: it has no samples (a crashed rollout has no trustworthy reward)."""
    in_flight: int = 0
    """Its requests still without a response: named when it ends with no call."""
    started_at: float = 0.0
    """When it was opened (wall clock): calls outside any episode since then explain an end
    with none of its own."""
    empty_advice: str | None = None
    """What to tell the user if it ends with no captured call (`Episode.empty_advice`)."""
    outside: bool = False
    """The collector's episode for calls outside any episode: its calls went to the processor as
    they came, so ending it with none is no warning."""
    requests: int = 0
    """The captured requests it sent (retries included)."""
    model_calls: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Model calls framework integrations saw completed in it, by framework
    (`Episode.note_model_call`): more than `requests` means some bypassed capture."""

    @property
    def bypassed_calls(self) -> int:
        """Model calls seen by integrations beyond the captured requests sent: each reached the
        model without capture (a retried request is counted by `requests`, so never a miss)."""
        return max(0, sum(self.model_calls.values()) - self.requests)

    @property
    def episode_id(self) -> str:
        return self.context.episode_id


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What the processor made of an ended episode, handed back for the episode to keep."""

    samples: tuple[Sample, ...] = ()
    """The samples handed to the sink (also when it refused them)."""
    divergences: tuple[Divergence, ...] = ()
    """Where merged samples split, and why."""
    tokens: int = 0
    trained_tokens: int = 0
    error: Exception | None = None
    """What the episode's end raises once it has kept all of the above: `EpisodeCaptureError`
    (`ErrorMode.EPISODE`) or the sink's `SinkError` (`SinkErrorMode.RAISE`); None otherwise."""
    empty_cause: EmptyEpisodeCause | None = None
    """Why it ended with no captured call (logged with the fix); None when it has calls."""
    bypassed_calls: int = 0
    """Model calls made beyond its captured requests (`EndedEpisode.bypassed_calls`)."""


OutsideBatch = tuple[EpisodeContext, list[Call]]
"""A batch of the processor's thread: calls outside any episode and the context they are
assembled in."""


class SampleProcessor:
    """Assembles ended episodes and hands their samples to `sink` (see the module docstring).

    settings: the collector's settings; how samples are made (`assembly`, `turn_discount`,
    `tokenizer`, `record_messages`) and what failures raise (`errors`, `sink_errors`) are
    read from it at each episode's end, so a change applies to the next one.
    """

    def __repr__(self) -> str:
        return f"SampleProcessor({self.sink!r})"

    def __init__(self, sink: Sink, *, stats: CollectorStats, settings: CollectorSettings) -> None:
        self.sink = sink
        self.stats = stats
        self.settings = settings
        self._worker: Worker[OutsideBatch] = Worker(
            WorkSource(
                waiting=self._waiting,
                linger=self._linger_for,
                take=self._take,
                finished=self._finished,
                run=self._run_batch,
                after_fork=self._reset_after_fork,
            ),
            name="tito-processor",
        )
        self._queue: deque[Call] = deque()
        """Calls outside any episode waiting for the thread."""
        self._outside: EpisodeContext | None = None
        """The context of the latest calls outside any episode: what the thread assembles in."""
        self._queued_calls = 0
        """Queued calls and those of the batch being handled."""
        self._recent_outside: deque[tuple[float, str | None]] = deque(maxlen=RECENT_OUTSIDE_CALLS)
        self._empty_groups: dict[str, int] = {}
        """Empty episodes per group, for the most recent `RECENT_EMPTY_GROUPS` groups."""
        self._busy = False
        self._draining = 0
        """Callers of `drain` waiting now: the thread does not linger for them."""
        self._closing = False
        lifecycle.drain_before_close(self)  # queued calls reach the sink before its last close

    @property
    def _cond(self) -> threading.Condition:
        """The lock of the counters and the queue (the worker's: a new one in a forked child).
        What runs on every call and episode takes it with `acquire` and `release` (C calls)
        rather than `with` (a Condition's `__enter__` and `__exit__` are Python functions)."""
        return self._worker.cond

    # ---- the EpisodeProcessor protocol ----

    def on_calls(self, recorded: RecordedCalls) -> None:
        """Count recorded calls; calls outside any episode are queued for the processor's thread."""
        calls = recorded.calls
        cond = self._cond
        cond.acquire()  # on every response: see `_cond`
        try:
            stats = self.stats
            if recorded.late:
                stats.late_calls += len(calls)
                return
            stats.duplicate_calls += len(calls) - recorded.added
            # a re-delivered response (every call id already seen) is no new call
            if recorded.added:
                counts = count_calls(calls)
                stats.complete_calls += counts.complete
                stats.incomplete_calls += counts.incomplete
                stats.unusable_calls += counts.unusable
                for c in calls:
                    if c.status is CallStatus.COMPLETE and c.constrained is not None:
                        stats.constrained_calls += 1
            if recorded.outside is None or not recorded.added:
                return
            self._recent_outside.extend((c.started_at, c.agent) for c in calls)
            full = self._queued_calls + len(calls) > MAX_QUEUED_CALLS or self._closing
            if full:
                stats.sink_failures += 1
                stats.lost_samples += len(calls)
            else:
                self._queue.extend(calls)
                self._outside = recorded.outside
                self._queued_calls += len(calls)
                self._worker.start()
                self._worker.wake(full=self._queued_calls >= EXPORT_BATCH_CALLS)
        finally:
            cond.release()
        if full:
            logger.error(
                "%d calls outside any episode dropped: the processor's queue is full (%d calls) or "
                "closed; counted in collector.stats.lost_samples",
                len(calls),
                MAX_QUEUED_CALLS,
            )

    def on_end(self, episode: EndedEpisode) -> ExportResult:
        """Assemble the episode's samples and hand them to the sink; the result says what the
        end raises."""
        calls = self._calls_to_assemble(episode)
        misses = self._misses(episode)
        if rescore.wanted(calls):
            self._count_rescored(_guarded(rescore.rescore, calls))
        samples, divergences, counts = self._assemble(episode.context, calls)
        sink_error: SinkError | None = None
        if samples:
            try:
                self.sink.write(samples)
            except Exception as exc:
                sink_error = self._sink_failed(samples, exc)
        return self._result(episode, samples, divergences, counts, sink_error, misses)

    async def aon_end(self, episode: EndedEpisode) -> ExportResult:
        """`on_end` for `async with`: never blocks the event loop."""
        calls = self._calls_to_assemble(episode)
        misses = self._misses(episode)
        if rescore.wanted(calls):
            try:
                done = await rescore.arescore(calls)
            except Exception:  # a defect: logged; the calls keep their flags
                logger.exception("re-scoring constrained calls failed")
                done = 0
            self._count_rescored((done, calls))
        samples, divergences, counts = self._assemble(episode.context, calls)
        sink_error: SinkError | None = None
        if samples:
            try:
                await self.sink.awrite(samples)
            except Exception as exc:
                sink_error = self._sink_failed(samples, exc)
        return self._result(episode, samples, divergences, counts, sink_error, misses)

    # ---- assembly ----

    def assemble(
        self, context: EpisodeContext, calls: list[Call]
    ) -> tuple[list[Sample], list[Divergence]]:
        """The samples of `calls` in `context`, in the assembly mode, and where merging split."""
        settings = self.settings
        mode = settings.assembly
        if mode is AssemblyMode.PER_CALL:  # reads neither the tokenizer's hooks nor the discount
            options = DEFAULT_OPTIONS
        else:
            options = AssemblyOptions.from_tokenizer(
                settings.tokenizer, mode, settings.turn_discount
            )
        samples, divergences = assemble(calls, context, options)
        if settings.record_messages:
            attach_call_messages(samples, calls)
        return samples, divergences

    def _calls_to_assemble(self, episode: EndedEpisode) -> list[Call]:
        """The calls of an ended episode (none when it failed: a failed episode has no samples)."""
        cond = self._cond
        cond.acquire()
        try:
            self.stats.episodes += 1
            if episode.failed:
                self.stats.failed_episodes += 1
        finally:
            cond.release()
        if episode.failed:
            return []
        return list(episode.calls)

    # ---- calls that escaped capture: never silent ----

    def _misses(self, episode: EndedEpisode) -> tuple[EmptyEpisodeCause | None, int]:
        """Count and log the calls of an ended episode that capture did not see: (why it ended
        with none, if it did; model calls made beyond its captured requests)."""
        if episode.failed or episode.outside:
            return None, 0
        bypassed = episode.bypassed_calls
        if bypassed:
            with self._cond:
                self.stats.bypassed_calls += bypassed
        if not episode.calls:
            return self._report_empty(episode), bypassed
        if bypassed:
            logger.warning(
                "episode %r: %d of the %d model calls %s made in it sent no captured request "
                "(a client that bypassed capture, or a response cache): never samples. Fix: %s",
                episode.episode_id,
                bypassed,
                sum(episode.model_calls.values()),
                _names(episode.model_calls),
                _fix_lines(_frameworks.fixes_named(episode.model_calls)),
            )
        return None, bypassed

    def _report_empty(self, episode: EndedEpisode) -> EmptyEpisodeCause:
        """An episode that ends with no captured call is never silent: it is counted and logged
        with the cause capture can tell from what it saw while the episode was open, and that
        cause's fix; returns the cause."""
        group = episode.context.group_id
        with self._cond:
            self.stats.empty_episodes += 1
            outside = Counter(a for t, a in self._recent_outside if t >= episode.started_at)
            captured = self.stats.requests
            empty_in_group = self._count_empty_group(group)
        cause = _empty_cause(episode, bool(outside), captured)
        with self._cond:
            causes = self.stats.empty_episode_causes
            causes[cause] = causes.get(cause, 0) + 1
        _warn_empty(episode, cause, outside, empty_in_group)
        return cause

    def _count_empty_group(self, group: str | None) -> int:
        """One more empty episode of `group` (with the lock); how many it has had."""
        if group is None:
            return 0
        groups = self._empty_groups
        count = groups.pop(group, 0) + 1
        groups[group] = count  # most recent last
        if len(groups) > RECENT_EMPTY_GROUPS:
            del groups[next(iter(groups))]
        return count

    def _assemble(
        self, context: EpisodeContext, calls: list[Call]
    ) -> tuple[list[Sample], list[Divergence], tuple[int, int]]:
        """`assemble`, counted in the stats; with the samples' (tokens, trained tokens)."""
        if not calls:
            return [], [], (0, 0)
        samples, divergences = self.assemble(context, calls)
        return samples, divergences, self._count_samples(samples)

    def _count_rescored(self, outcome: tuple[int, list[Call]]) -> None:
        done, calls = outcome
        failures = sum(1 for c in rescore.wanted(calls) if c.rescore_error is not None)
        with self._cond:
            self.stats.rescored_calls += done
            self.stats.rescore_failures += failures
        if failures:
            reason = next(c.rescore_error for c in calls if c.rescore_error is not None)
            logger.warning(
                "%d constrained calls could not be re-scored (%s); their samples keep the "
                "masked logprobs, flagged (CallSpan.logprob_source == 'masked')",
                failures,
                reason,
            )

    def _count_samples(self, samples: list[Sample]) -> tuple[int, int]:
        """Count `samples` in the stats; returns their (tokens, trained tokens)."""
        tokens, trained = _token_counts(samples)
        cond = self._cond
        cond.acquire()
        try:
            self.stats.samples += len(samples)
            self.stats.tokens += tokens
            self.stats.trained_tokens += trained
        finally:
            cond.release()
        return tokens, trained

    def _result(
        self,
        episode: EndedEpisode,
        samples: list[Sample],
        divergences: list[Divergence],
        counts: tuple[int, int],
        sink_error: SinkError | None,
        misses: tuple[EmptyEpisodeCause | None, int],
    ) -> ExportResult:
        tokens, trained = counts
        return ExportResult(
            samples=tuple(samples),
            divergences=tuple(divergences),
            tokens=tokens,
            trained_tokens=trained,
            error=self._error_to_raise(episode, sink_error),
            empty_cause=misses[0],
            bypassed_calls=misses[1],
        )

    def _error_to_raise(
        self, episode: EndedEpisode, sink_error: SinkError | None
    ) -> Exception | None:
        """What the policies say the episode's end raises (nothing after a failed body: its own
        exception is on its way)."""
        if episode.failed:
            return None
        if episode.errors and self.settings.errors is ErrorMode.EPISODE:
            return EpisodeCaptureError(episode.episode_id, list(episode.errors))
        if sink_error is not None and self.settings.sink_errors is SinkErrorMode.RAISE:
            return sink_error
        return None

    def _sink_failed(self, samples: list[Sample], exc: Exception) -> SinkError:
        """Count and log a failed hand-off once; the error to raise in the strict mode."""
        with self._cond:
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

    # ---- the processor's thread (calls outside any episode; `_worker.WorkSource`) ----

    def _waiting(self) -> int:
        return len(self._queue)

    def _linger_for(self, waiting: int) -> float:
        """Linger only to fill a batch, and never while `drain` or `stop` waits."""
        if self._closing or self._draining or self._queued_calls >= EXPORT_BATCH_CALLS:
            return 0.0
        return EXPORT_LINGER_S

    def _take(self) -> OutsideBatch | None:
        if not self._queue or self._outside is None:
            return None
        calls = list(self._queue)
        self._queue.clear()
        self._busy = True
        return self._outside, calls

    def _finished(self) -> bool:
        return self._closing

    def _run_batch(self, batch: OutsideBatch) -> bool:
        context, calls = batch
        try:
            self._export_outside(context, calls)
        finally:
            with self._cond:
                self._queued_calls -= len(calls)
                self._worker.batch_done()
                self._busy = False
                self._cond.notify_all()
        return True

    def _reset_after_fork(self) -> None:
        """In a forked child (the worker has a new lock and no thread): the parent hands over
        what it had queued; the child starts with an empty queue, drained at its own exit."""
        self._queue = deque()
        self._outside = None
        self._queued_calls = 0
        self._busy = False
        self._draining = 0
        lifecycle.drain_before_close(self)

    def _export_outside(self, context: EpisodeContext, calls: list[Call]) -> None:
        if rescore.wanted(calls):
            self._count_rescored(_guarded(rescore.rescore, calls))
        try:
            samples, _ = self.assemble(context, calls)
        except Exception:  # a defect: logged, and the thread goes on with the next calls
            logger.exception("assembling %d calls outside any episode failed", len(calls))
            return
        if not samples:
            return
        self._count_samples(samples)
        try:
            self.sink.write(samples)
        except Exception as exc:
            self._sink_failed(samples, exc)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued call outside an episode is handed to the sink."""
        with self._cond:
            self._draining += 1
            self._cond.notify_all()  # a lingering thread goes on at once
            try:
                return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)
            finally:
                self._draining -= 1

    def flush(self) -> None:
        """Return once everything handed over so far is in the sink, and the sink is flushed."""
        self.drain()
        self.sink.flush()

    def stop(self) -> None:
        """Drain the queue and end the processor's thread (new calls are then counted as lost)."""
        self.drain()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._worker.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def _token_counts(samples: list[Sample]) -> tuple[int, int]:
    """The tokens and trained tokens of `samples`."""
    tokens = trained = 0
    for sample in samples:
        tokens += sample.num_tokens
        trained += sample.num_trained
    return tokens, trained


def _guarded(run: Callable[[list[Call]], int], calls: list[Call]) -> tuple[int, list[Call]]:
    """Run a re-scoring pass; a defect in it is logged and never reaches the agent."""
    try:
        return run(calls), calls
    except Exception:
        logger.exception("re-scoring constrained calls failed")
        return 0, calls


def _empty_cause(episode: EndedEpisode, outside: bool, captured: int) -> EmptyEpisodeCause:
    """The likeliest reason an episode ended with no captured call, from the strongest evidence
    down: its own requests still in flight; an integration that saw its framework make calls;
    calls captured outside any episode while it was open; a response cache while capture works
    (this collector captured requests); else no capturing client at all."""
    if episode.in_flight:
        return EmptyEpisodeCause.IN_FLIGHT
    if episode.bypassed_calls:
        return EmptyEpisodeCause.BYPASSED_CAPTURE
    if outside:
        return EmptyEpisodeCause.OUTSIDE_EPISODE
    if captured and _frameworks.response_caches():
        return EmptyEpisodeCause.RESPONSE_CACHE
    return EmptyEpisodeCause.NO_CAPTURING_CLIENT


def _warn_empty(
    episode: EndedEpisode,
    cause: EmptyEpisodeCause,
    outside: Counter[str | None],
    empty_in_group: int,
) -> None:
    """Log an empty episode with its cause and that cause's fix."""
    name = episode.episode_id
    if cause is EmptyEpisodeCause.IN_FLIGHT:  # through capture: the advice to wrap is wrong
        logger.warning(
            "episode %r ended with no captured call while %d of its calls were still in "
            "flight (a stream left before its end and not closed, or a request of a task not "
            "awaited): never samples of this episode (collector.stats.late_calls if they "
            "finish). Fix: end the episode once its requests are done (close a stream you "
            "leave early)",
            name,
            episode.in_flight,
        )
    elif cause is EmptyEpisodeCause.BYPASSED_CAPTURE:
        logger.warning(
            "episode %r ended with no captured call while %s completed %d model calls in it: "
            "they reached the model without capture (a client that bypassed it, a client built "
            "per request, or a response cache). Fix: %s",
            name,
            _names(episode.model_calls),
            episode.bypassed_calls,
            _fix_lines(_frameworks.fixes_named(episode.model_calls)),
        )
    elif episode.empty_advice is not None:
        logger.warning(
            "episode %r ended with no captured call (%d calls to vLLM were captured outside "
            "any episode while it was open). Fix: %s",
            name,
            outside.total(),
            episode.empty_advice,
        )
    elif cause is EmptyEpisodeCause.OUTSIDE_EPISODE:
        agents = ", ".join(f"{agent!r}: {n}" for agent, n in sorted(outside.items(), key=str))
        logger.warning(
            "episode %r ended with no captured call, while %d calls to vLLM were captured "
            "outside any episode (by agent: %s): the run started or went on outside the "
            "episode's context. Fix: start the run inside the episode (e.g. call "
            "Runner.run_streamed or graph.astream inside `with collector.episode()`) and carry "
            "the context into raw threads with tito_agents.bind",
            name,
            outside.total(),
            agents,
        )
    elif cause is EmptyEpisodeCause.RESPONSE_CACHE:
        group = episode.context.group_id
        logger.warning(
            "episode %r ended with no captured call while %s's response cache is on and other "
            "calls were captured%s: a prompt answered before (a group's identical rollouts) is "
            "answered from the cache, with no request to capture. Fix: %s",
            name,
            " and ".join(_frameworks.response_caches()),
            f" ({empty_in_group} episodes of group {group!r} ended empty)" if group else "",
            _fix_lines(_frameworks.fixes_named(_frameworks.response_caches())),
        )
    else:
        imported = _frameworks.imported_fixes()
        logger.warning(
            "episode %r ended with no captured call, and no call to vLLM was captured "
            "outside it either: the agent's requests did not go through a capturing client. "
            "Fix: wrap the client the agent really uses (collector.wrap(client), or the "
            "framework integration's install) and list its host in vllm_hosts%s",
            name,
            f". Frameworks imported here: {_fix_lines(imported)}" if imported else "",
        )


def _names(counts: Mapping[str, int]) -> str:
    return ", ".join(sorted(counts))


def _fix_lines(fixes: list[_frameworks.FrameworkFix]) -> str:
    """The fixes as one log line (each framework's, `;`-separated), or where they are listed."""
    if not fixes:
        return f"give the framework a capturing client ({_frameworks.DOCS})"
    return "; ".join(fix.line() for fix in fixes)
