"""Export: the stage after episodes. Ended episodes become samples (assembly) and go to the sink;
failures are caught, logged once and counted, never thrown into the agent's calls.

The `SampleProcessor` is the `EpisodeProcessor` every episode reports to, in OpenTelemetry's
terms a processor: it hears of ended episodes (as a span processor hears of ended spans) and
enqueues their samples to the sink, which exports them (a `BufferedSink` delivers in a thread of
its own). Two paths:

* an episode's end (`on_end`, on the thread or event loop that exits it): assemble, count, hand
  the samples to the sink; raise capture errors (and, in the strict mode, a sink failure) there;
* calls outside any episode (`on_calls` for the default episode, on the request path): only
  counted and queued there; one ``tito-processor`` thread (`_worker.Worker`) assembles and writes
  them, so neither assembly nor the sink ever runs inside the agent's HTTP call (in batches while
  they come often: `EXPORT_LINGER_S`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from tito_agents import rescore
from tito_agents._worker import Worker, WorkSource
from tito_agents.assembly import AssemblyOptions, Divergence, EpisodeContext, assemble
from tito_agents.assembly.call_messages import attach_call_messages
from tito_agents.calls import Call, CallStatus, count_calls
from tito_agents.config import CollectorSettings, CollectorStats, ErrorMode, SinkErrorMode
from tito_agents.errors import CaptureError, EpisodeCaptureError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import Sink, lifecycle

logger = logging.getLogger("tito_agents")

RECENT_OUTSIDE_CALLS = 1024
"""How many recent calls outside any episode are remembered (start time, agent) to explain an
episode that ends with none of its own."""

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


class EpisodeCounts(Protocol):
    """The counters of an episode's report the processor adds to (`episodes.EpisodeReport`)."""

    samples: int
    tokens: int
    trained_tokens: int
    divergences: dict[str, int]
    in_flight: int


class EpisodeView(Protocol):
    """What the exporter reads of an episode and hands back to it: an `episodes.Episode` as the
    export stage sees it. Export knows episodes through this shape only (the stage before it
    reports through `episodes.EpisodeProcessor`), so it never imports the episodes module."""

    episode_id: str
    task_id: str | None
    group_id: str | None
    metadata: dict[str, Any]
    reward: float | None
    started_at: float
    empty_advice: str | None
    closed: bool
    errors: list[CaptureError]
    divergences: list[Divergence]

    @property
    def report(self) -> EpisodeCounts: ...

    def _take_calls(self) -> list[Call]:
        """Hand over and forget the calls recorded so far (the default episode)."""
        ...

    def _close_calls(self) -> list[Call]:
        """Freeze the episode and return its calls."""
        ...

    def _ended_with(self, samples: list[Sample]) -> None:
        """Keep the samples the ended episode produced."""
        ...


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
        self.default_episode: EpisodeView | None = None
        """The collector's episode for calls outside any episode (set once it exists)."""
        self._worker: Worker[list[Call]] = Worker(
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
        """Calls outside any episode (all of `default_episode`) waiting for the thread."""
        self._queued_calls = 0
        """Queued calls and those of the batch being handled."""
        self._recent_outside: deque[tuple[float, str | None]] = deque(maxlen=RECENT_OUTSIDE_CALLS)
        self._busy = False
        self._draining = 0
        """Callers of `drain` waiting now: the thread does not linger for them."""
        self._closing = False
        lifecycle.drain_before_close(self)  # queued calls reach the sink before its last close

    @property
    def _cond(self) -> threading.Condition:
        """The lock of the counters and the queue (the worker's: a new one in a forked child)."""
        return self._worker.cond

    # ---- the EpisodeProcessor protocol ----

    def on_calls(self, episode: EpisodeView, calls: list[Call], added: int) -> None:
        """Count recorded calls; calls outside any episode are queued for the processor's thread."""
        with self._cond:
            stats = self.stats
            if added == 0 and episode.closed:
                stats.late_calls += len(calls)
                return
            stats.duplicate_calls += len(calls) - added
            if added:  # a re-delivered response (every call id already seen) is no new call
                counts = count_calls(calls)
                stats.complete_calls += counts.complete
                stats.incomplete_calls += counts.incomplete
                stats.unusable_calls += counts.unusable
                stats.constrained_calls += sum(
                    1
                    for c in calls
                    if c.status is CallStatus.COMPLETE and c.constrained is not None
                )
            if episode is not self.default_episode or not added:
                return
            taken = episode._take_calls()
            self._recent_outside.extend((c.started_at, c.agent) for c in taken)
            if self._queued_calls + len(taken) > MAX_QUEUED_CALLS or self._closing:
                stats.sink_failures += 1
                stats.lost_samples += len(taken)
                full = True
            else:
                self._queue.extend(taken)
                self._queued_calls += len(taken)
                self._worker.start()
                self._worker.wake(full=self._queued_calls >= EXPORT_BATCH_CALLS)
                full = False
        if full:
            logger.error(
                "%d calls outside any episode dropped: the processor's queue is full (%d calls) or "
                "closed; counted in collector.stats.lost_samples",
                len(taken),
                MAX_QUEUED_CALLS,
            )

    def on_end(self, episode: EpisodeView, *, failed: bool) -> None:
        """Assemble and hand over the episode's samples, then raise what the policies say."""
        calls = self._close(episode, failed)
        if rescore.wanted(calls):
            self._count_rescored(_guarded(rescore.rescore, calls))
        samples = self._finish(episode, calls)
        episode._ended_with(samples)
        sink_error: SinkError | None = None
        if samples:
            try:
                self.sink.write(samples)
            except Exception as exc:
                sink_error = self._sink_failed(samples, exc)
        self._raise_errors(episode, failed, sink_error)

    async def aon_end(self, episode: EpisodeView, *, failed: bool) -> None:
        calls = self._close(episode, failed)
        if rescore.wanted(calls):
            try:
                done = await rescore.arescore(calls)
            except Exception:  # a defect: logged; the calls keep their flags
                logger.exception("re-scoring constrained calls failed")
                done = 0
            self._count_rescored((done, calls))
        samples = self._finish(episode, calls)
        episode._ended_with(samples)
        sink_error: SinkError | None = None
        if samples:
            try:
                await self.sink.awrite(samples)
            except Exception as exc:
                sink_error = self._sink_failed(samples, exc)
        self._raise_errors(episode, failed, sink_error)

    # ---- assembly ----

    def assemble(self, episode: EpisodeView, calls: list[Call]) -> list[Sample]:
        """The samples of `calls` of `episode`, in the assembly mode. Divergences found while
        merging are kept on `episode.divergences` and counted in `episode.report`."""
        settings = self.settings
        options = AssemblyOptions.from_tokenizer(
            settings.tokenizer, settings.assembly, settings.turn_discount
        )
        context = EpisodeContext(
            episode_id=episode.episode_id,
            episode_reward=episode.reward,
            task_id=episode.task_id,
            group_id=episode.group_id,
            metadata=dict(episode.metadata) if episode.metadata else None,
        )
        samples, divergences = assemble(calls, context, options)
        if settings.record_messages:
            attach_call_messages(samples, calls)
        episode.divergences.extend(divergences)
        for divergence in divergences:
            kind = divergence.kind.value
            episode.report.divergences[kind] = episode.report.divergences.get(kind, 0) + 1
        return samples

    def _close(self, episode: EpisodeView, failed: bool) -> list[Call]:
        """The calls of an ended episode (none when it failed: a failed episode has no samples)."""
        calls = episode._close_calls()
        with self._cond:
            self.stats.episodes += 1
            if failed:
                self.stats.failed_episodes += 1
        if failed:
            return []
        if not calls and episode is not self.default_episode:
            self._report_empty(episode)
        return calls

    def _report_empty(self, episode: EpisodeView) -> None:
        """An episode that ends with no captured call is never silent: it is counted and logged
        with what capture saw while it was open (calls outside any episode, by agent, or none)."""
        with self._cond:
            self.stats.empty_episodes += 1
            outside = Counter(a for t, a in self._recent_outside if t >= episode.started_at)
        in_flight = episode.report.in_flight
        if in_flight:  # its calls went through capture: the advice to wrap the client is wrong
            logger.warning(
                "episode %r ended with no captured call while %d of its calls were still in "
                "flight (a stream left before its end and not closed, or a request of a task not "
                "awaited): never samples of this episode (collector.stats.late_calls if they "
                "finish). Fix: end the episode once its requests are done (close a stream you "
                "leave early)",
                episode.episode_id,
                in_flight,
            )
        elif episode.empty_advice is not None:
            logger.warning(
                "episode %r ended with no captured call (%d calls to vLLM were captured outside "
                "any episode while it was open). Fix: %s",
                episode.episode_id,
                outside.total(),
                episode.empty_advice,
            )
        elif outside:
            agents = ", ".join(f"{agent!r}: {n}" for agent, n in sorted(outside.items(), key=str))
            logger.warning(
                "episode %r ended with no captured call, while %d calls to vLLM were captured "
                "outside any episode (by agent: %s): the run started or went on outside the "
                "episode's context. Fix: start the run inside the episode (e.g. call "
                "Runner.run_streamed or graph.astream inside `with collector.episode()`) and carry "
                "the context into raw threads with tito_agents.bind",
                episode.episode_id,
                outside.total(),
                agents,
            )
        else:
            logger.warning(
                "episode %r ended with no captured call, and no call to vLLM was captured "
                "outside it either: the agent's requests did not go through a capturing client. "
                "Fix: wrap the client the agent really uses (collector.wrap(client), or the "
                "framework integration's install) and list its host in vllm_hosts",
                episode.episode_id,
            )

    def _finish(self, episode: EpisodeView, calls: list[Call]) -> list[Sample]:
        if not calls:
            return []
        samples = self.assemble(episode, calls)
        self._count_samples(episode, samples)
        return samples

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

    def _count_samples(self, episode: EpisodeView, samples: list[Sample]) -> None:
        tokens = trained = 0
        for sample in samples:
            tokens += sample.num_tokens
            trained += sample.num_trained
        report = episode.report
        with self._cond:
            report.samples += len(samples)
            report.tokens += tokens
            report.trained_tokens += trained
            self.stats.samples += len(samples)
            self.stats.tokens += tokens
            self.stats.trained_tokens += trained

    def _raise_errors(
        self, episode: EpisodeView, failed: bool, sink_error: SinkError | None
    ) -> None:
        if failed:
            return
        if episode.errors and self.settings.errors is ErrorMode.EPISODE:
            raise EpisodeCaptureError(episode.episode_id, list(episode.errors))
        if sink_error is not None and self.settings.sink_errors is SinkErrorMode.RAISE:
            raise sink_error

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

    def _take(self) -> list[Call] | None:
        if not self._queue:
            return None
        calls = list(self._queue)
        self._queue.clear()
        self._busy = True
        return calls

    def _finished(self) -> bool:
        return self._closing

    def _run_batch(self, calls: list[Call]) -> bool:
        try:
            assert self.default_episode is not None  # set before its first call is queued
            self._export_outside(self.default_episode, calls)
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
        self._queued_calls = 0
        self._busy = False
        self._draining = 0
        lifecycle.drain_before_close(self)

    def _export_outside(self, episode: EpisodeView, calls: list[Call]) -> None:
        if rescore.wanted(calls):
            self._count_rescored(_guarded(rescore.rescore, calls))
        try:
            samples = self.assemble(episode, calls)
        except Exception:  # a defect: logged, and the thread goes on with the next calls
            logger.exception("assembling %d calls outside any episode failed", len(calls))
            return
        if not samples:
            return
        self._count_samples(episode, samples)
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


def _guarded(run: Callable[[list[Call]], int], calls: list[Call]) -> tuple[int, list[Call]]:
    """Run a re-scoring pass; a defect in it is logged and never reaches the agent."""
    try:
        return run(calls), calls
    except Exception:
        logger.exception("re-scoring constrained calls failed")
        return 0, calls
