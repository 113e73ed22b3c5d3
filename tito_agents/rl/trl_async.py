"""A rollout worker for TRL's `AsyncGRPOTrainer` that runs your agent through tito capture.

    async def agent(prompt, client) -> float | None: ...   # your agent; returns its reward

    collector = tito.Collector(capture_logprobs=True, assembly="merged")
    client = collector.wrap(openai.AsyncOpenAI(base_url=VLLM_URL, api_key="EMPTY"))
    worker = TitoRolloutWorker(agent, collector, client, dataset, num_generations=8)
    trainer = AsyncGRPOTrainer(..., train_dataset=dataset, rollout_worker=worker)
    trainer.train()

Why: TRL 1.16's own `AsyncRolloutWorker` generates through vLLM's completions route with its own
chat template and tool loop, so an agent written against an openai client (or a framework) is not
what it trains on. `AsyncGRPOTrainer(rollout_worker=...)` takes any object with the shape of its
`RolloutWorkerProtocol`; this is one: the trainer reads `rollout_buffer` (the queue its dataset
drains) and `metrics_queue` (drained in `log()`), and calls `start()` on train begin (after the
first weight sync), `update_model_version(v)` after every weight sync, `check_health(s)` while it
waits on an empty queue, and `stop()` on train end. Nothing private of TRL is touched; the
`RolloutSample` type and the protocol are pinned to `SUPPORTED_TRL` (`check_trl_version` on
`start`) and `tests/unit/test_rl_trl_async.py` checks both on the installed TRL. TRL's weight
transfer (`weight_transfer=`, NCCL into the vLLM server by default) is the trainer's and stays.

What it does: a background thread with its own event loop walks the dataset (`epochs` times, or
forever), runs `num_generations` episodes of each row's `prompt_key` concurrently (one GRPO
group; `max_inflight_groups` groups at once), takes each episode's reward (the `reward_func`, else
what the agent returned, else what it set on the episode), normalises it within the group as TRL's
worker does (`(r - mean) / (std + 1e-8)` over the scored episodes) and puts one `RolloutSample`
per merged sample on `rollout_buffer`, built from the ids, loss mask and logprobs tito captured
(`to_trl_rollout_samples`).

Versions: `update_model_version(v)` sets `collector.settings.policy_version = v`, so every call
dispatched after it is labelled with the weights the engine then serves, and each sample's
`model_version` is the oldest version on its spans (`policy_version_of`): the trainer's staleness
filter (`max_staleness`) judges a sample by the oldest weights that produced any of its tokens.

Linked segments: an episode whose calls do not chain into one sequence has several merged samples.
`linked="rows"` (default) puts each on the queue as its own row, all with the episode's one
advantage, as TRL's own worker does with a conversation that yields several training rows;
`linked="refuse"` skips such an episode and counts it, keeping the reason (`episode_sample`'s
message with its fix) in `stats.last_skip`.

Bad input never raises inside the trainer's loop: an agent (or a `reward_func`) that raises, an
episode with no captured call, or a refused split episode is skipped and counted (`stats`, and
`tito/*` metrics on `metrics_queue`); a reward that is None or not a finite number leaves its rows
in with advantage 0 (TRL's own rule for an unscorable completion) and is counted; a group whose
rewards are all equal gets advantage 0 everywhere. A worker that produces nothing (every episode
failing) stops beating: `check_health` raises after the trainer's `heartbeat_stale_after_s` with
the counts and the last failure. An error of the worker itself (not of one episode) is raised by
the next `check_health`; a finite run (`epochs=`) that is done raises there too, saying so.

Its own module, imported by name or from `tito_agents.rl`: it needs TRL only on `start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from tito_agents.collector import Collector
from tito_agents.convert import to_trl_rollout_samples
from tito_agents.episodes import Episode
from tito_agents.rl.trl_engine import check_trl_version
from tito_agents.rl.trl_rollout import (
    AGENT_FIX,
    Agent,
    EpisodeSplitError,
    episode_sample,
    require_merged_logprobs,
)
from tito_agents.samples import Sample

logger = logging.getLogger(__name__)

RewardFunc = Callable[[Mapping[str, Any], Episode], Any]
"""`reward_func(row, episode) -> float | None`: the reward of an ended episode of dataset `row`
(its samples are made: read their text or ids). None or a non-finite value: unscored."""

Linked = Literal["rows", "refuse"]
"""What an episode of several merged samples becomes (see the module doc)."""

ADVANTAGE_EPS = 1e-8
"""TRL's `AsyncRolloutWorker` divides by `std + 1e-8`; the same here, so advantages match."""

PUT_POLL_S = 0.05
"""How often a full `rollout_buffer` is retried (the trainer frees it; `stop` interrupts)."""


@dataclass(slots=True)
class WorkerStats:
    """What the worker did so far (cumulative; read from any thread)."""

    groups: int = 0
    """Groups with at least one sample put on the queue."""
    samples: int = 0
    """`RolloutSample`s put on the queue."""
    skipped_episodes: int = 0
    """Episodes left out: the agent raised, no captured call, or a refused split."""
    skipped_groups: int = 0
    """Groups of which every episode was skipped (nothing put)."""
    unscored_episodes: int = 0
    """Episodes whose reward was None or not a finite number (advantage 0)."""
    linked_rows: int = 0
    """Rows beyond the first of an episode of several merged samples (`linked="rows"`)."""
    last_skip: str | None = None
    """Why the latest episode was skipped."""


class TitoRolloutWorker:
    """`rollout_worker=` for TRL's `AsyncGRPOTrainer`: your agent, captured by tito.

    agent: `async def agent(prompt, client) -> reward` (see `tito_agents.rl.Agent`).
    collector: captures with logprobs (`capture_logprobs=True`: TRL's `old_log_probs`) and merged
        assembly ("merged" or "both").
    client: the async openai client the collector wrapped, handed to `agent`. It lives on the
        worker's own event loop and is closed when the worker ends: one `start` per worker.
    dataset: rows (mappings) indexable by position, e.g. the trainer's `train_dataset`.
    num_generations: episodes per row (one GRPO group); the trainer's `args.num_generations`.
    reward_func: `RewardFunc` (None: the agent's reward, else the episode's).
    prompt_key: the row field handed to `agent` as its prompt.
    max_inflight_groups: groups run at once.
    queue_maxsize: `rollout_buffer`'s bound (0: none); the trainer's `args.queue_maxsize`.
    epochs: passes over the dataset (None: forever; the trainer stops at `max_steps`).
    linked: "rows" or "refuse" (see the module doc).
    sessions: token-in sessions for every episode (None: as the client was wrapped).
    """

    def __init__(
        self,
        agent: Agent,
        collector: Collector,
        client: Any,
        dataset: Sequence[Mapping[str, Any]],
        *,
        num_generations: int,
        reward_func: RewardFunc | None = None,
        prompt_key: str = "prompt",
        max_inflight_groups: int = 1,
        queue_maxsize: int = 0,
        epochs: int | None = None,
        linked: Linked = "rows",
        sessions: bool | None = None,
    ) -> None:
        require_merged_logprobs(
            collector,
            "TitoRolloutWorker builds rows from merged samples",
            "AsyncGRPO trains on the old policy's logprobs (RolloutSample.old_log_probs)",
        )
        if num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {num_generations}")
        if max_inflight_groups < 1:
            raise ValueError(f"max_inflight_groups must be >= 1, got {max_inflight_groups}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None, got {epochs}")
        if linked not in ("rows", "refuse"):
            raise ValueError(f"linked must be 'rows' or 'refuse', got {linked!r}")
        if len(dataset) == 0:
            raise ValueError("the dataset has no rows")
        self.agent = agent
        self.collector = collector
        self.client = client
        self.dataset = dataset
        self.num_generations = num_generations
        self.reward_func = reward_func
        self.prompt_key = prompt_key
        self.max_inflight_groups = max_inflight_groups
        self.epochs = epochs
        self.linked = linked
        self.sessions = sessions
        # the protocol's queues: in-process, so `queue.Queue` (TRL allows either kind)
        self.rollout_buffer: queue.Queue[Any] = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue(maxsize=4096)
        self.model_version = 0
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self._run_id = uuid.uuid4().hex[:8]
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._exhausted = False
        self._heartbeat = 0.0
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._sample_type: Any = None

    # ---- RolloutWorkerProtocol ----

    def start(self) -> None:
        """Begin producing rollouts on a background thread (once; a second call is ignored)."""
        if self._thread is not None:
            logger.warning("TitoRolloutWorker.start() called twice; ignoring")
            return
        check_trl_version()
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        self._sample_type = RolloutSample
        self.update_model_version(self.model_version)
        self._heartbeat = time.time()
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="tito-async-grpo-worker", daemon=True
        )
        self._thread.start()
        started.wait()

    def stop(self) -> None:
        """Stop producing: in-flight episodes are cancelled and the thread joined (idempotent)."""
        self._stopping.set()
        loop, main, thread = self._loop, self._main, self._thread
        if loop is not None and main is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed since the check
                loop.call_soon_threadsafe(main.cancel)
        if thread is not None:
            thread.join(timeout=60)
            if thread.is_alive():
                logger.warning("TitoRolloutWorker: the worker thread did not stop within 60s")

    def update_model_version(self, model_version: int) -> None:
        """The version the engine now serves: calls dispatched from now on are labelled with it."""
        self.model_version = int(model_version)
        self.collector.settings.policy_version = str(self.model_version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise if the worker failed, ran out of data, or put nothing for `stale_after_s`."""
        if self._failure is not None:
            raise RuntimeError(
                f"the tito rollout worker failed: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure
        if self._exhausted and not self._stopping.is_set():
            raise RuntimeError(
                f"the tito rollout worker went through the dataset {self.epochs} time(s) and "
                "has no more rollouts (raise epochs=, or set the trainer's max_steps lower)"
            )
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            stats = self.stats
            raise RuntimeError(
                f"the tito rollout worker finished no episode for {age:.0f}s > {stale_after_s:.0f}s "
                f"({stats.skipped_episodes} episodes skipped so far; last: {stats.last_skip})"
            )

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until the worker has ended: its `epochs` done (every row put or skipped), stopped,
        or failed. True if it has (for a finite run, e.g. an evaluation pass or a test)."""
        return self._done.wait(timeout)

    # ---- the background loop ----

    def _run(self, started: threading.Event) -> None:
        assert self._loop is not None
        loop = self._loop
        asyncio.set_event_loop(loop)
        self._main = loop.create_task(self._produce())
        started.set()
        try:
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # surfaced by check_health, in the trainer's thread
            logger.exception("TitoRolloutWorker failed")
            self._failure = exc
        finally:
            # its connections were opened on this loop, which ends here: nothing else can close them
            closer = getattr(self.client, "close", None)
            if closer is not None and inspect.iscoroutinefunction(closer):
                with contextlib.suppress(Exception):
                    loop.run_until_complete(closer())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._done.set()

    async def _produce(self) -> None:
        gate = asyncio.Semaphore(self.max_inflight_groups)
        running: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []

        def done(task: asyncio.Task[None]) -> None:
            running.discard(task)
            gate.release()
            if not task.cancelled() and task.exception() is not None:
                errors.append(task.exception())  # type: ignore[arg-type]

        try:
            for index, row in enumerate(self._rows()):
                await gate.acquire()
                if errors:  # an error of the worker itself (not of one episode) ends the run
                    raise errors[0]
                if self._stopping.is_set():
                    return
                task = asyncio.create_task(self._group(index, row))
                running.add(task)
                task.add_done_callback(done)
            await asyncio.gather(*running, return_exceptions=True)
            if errors:
                raise errors[0]
        finally:
            pending = list(running)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._exhausted = True

    def _rows(self) -> Any:
        passes = itertools.count() if self.epochs is None else range(self.epochs)
        for _ in passes:
            for position in range(len(self.dataset)):
                yield self.dataset[position]

    async def _group(self, index: int, row: Mapping[str, Any]) -> None:
        """One GRPO group of `row`: its episodes, rewards, advantages, and rows on the queue."""
        group_id = f"{self._run_id}-{index}"
        prompt = row[self.prompt_key]
        outcomes = await asyncio.gather(
            *(self._episode(prompt, group_id, g) for g in range(self.num_generations)),
            return_exceptions=True,
        )
        kept: list[tuple[list[Sample], float]] = []
        for generation, outcome in enumerate(outcomes):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                self._skip(f"group {index} generation {generation}: the agent raised {outcome!r}")
                continue
            episode, returned = outcome
            where = f"group {index} generation {generation}"
            samples = self._samples_of(episode, where)
            if samples is None:
                continue
            try:
                reward = self._reward(row, episode, returned)
            except Exception as exc:  # the user's reward function: one episode, not the run
                self._skip(f"{where}: the reward function raised {exc!r}")
                continue
            kept.append((samples, reward))
        metrics = {
            "tito/skipped_episodes": float(self.num_generations - len(kept)),
            "tito/unscored_episodes": float(sum(math.isnan(r) for _, r in kept)),
        }
        if not kept:
            with self._lock:
                self.stats.skipped_groups += 1
            self._metrics(metrics)
            return
        rewards = np.array([reward for _, reward in kept], dtype=float)
        advantages = group_advantages(rewards)
        records = to_trl_rollout_samples(
            [s for samples, _ in kept for s in samples],
            advantages=[
                a for (samples, _), a in zip(kept, advantages, strict=True) for _ in samples
            ],
        )
        rewards_per_row = [r for (samples, r) in kept for _ in samples]
        linked = sum(len(samples) - 1 for samples, _ in kept)
        for record, reward in zip(records, rewards_per_row, strict=True):
            record["metrics"] = {"reward": reward}
            await self._put(self._sample_type(**record))
        with self._lock:
            self.stats.groups += 1
            self.stats.samples += len(records)
            self.stats.linked_rows += linked
        self._metrics({**metrics, "tito/linked_rows": float(linked)})

    async def _episode(self, prompt: Any, group_id: str, generation: int) -> tuple[Episode, Any]:
        async with self.collector.episode(
            group_id=group_id, sessions=self.sessions, metadata={"generation": generation}
        ) as ep:
            running = self.agent(prompt, self.client)
            if not inspect.isawaitable(running):  # a plain `def`: `await` would not say why
                raise TypeError(f"the agent returned {type(running).__name__}: {AGENT_FIX}")
            returned = await running
        self._heartbeat = time.time()
        return ep, returned

    def _samples_of(self, episode: Episode, where: str) -> list[Sample] | None:
        """The episode's merged samples, or None (skipped and counted) when it has none or is a
        split this worker refuses."""
        merged = [s for s in episode.samples if s.view == "merged"]
        if not merged or (len(merged) > 1 and self.linked == "refuse"):
            try:
                episode_sample(episode)
            except EpisodeSplitError as exc:
                self._skip(f"{where}: {exc}")
            return None
        return merged

    def _reward(self, row: Mapping[str, Any], episode: Episode, returned: Any) -> float:
        """The episode's reward as a finite float, or NaN (unscored, counted)."""
        if self.reward_func is not None:
            given = self.reward_func(row, episode)
        elif returned is not None:
            given = returned
        else:
            given = episode.reward
        try:
            value = float(given)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            with self._lock:
                self.stats.unscored_episodes += 1
            return math.nan
        return value

    def _skip(self, why: str) -> None:
        logger.warning("TitoRolloutWorker skipped an episode: %s", why)
        with self._lock:
            self.stats.skipped_episodes += 1
            self.stats.last_skip = why

    async def _put(self, sample: Any) -> None:
        while not self._stopping.is_set():
            sample.enqueued_at = time.time()
            try:
                self.rollout_buffer.put_nowait(sample)
            except queue.Full:
                await asyncio.sleep(PUT_POLL_S)
                continue
            self._heartbeat = time.time()
            return

    def _metrics(self, payload: dict[str, float]) -> None:
        # the trainer drains it in log() only: dropping a metric beats blocking the rollouts
        with contextlib.suppress(queue.Full):
            self.metrics_queue.put_nowait(payload)


def group_advantages(rewards: np.ndarray) -> np.ndarray:
    """TRL's group normalisation: `(r - mean) / (std + 1e-8)` over the finite rewards, 0 for NaN
    (unscored) ones; all-equal rewards give 0 everywhere."""
    advantages = np.zeros_like(rewards, dtype=float)
    scored = ~np.isnan(rewards)
    if scored.any():
        values = rewards[scored]
        advantages[scored] = (values - values.mean()) / (values.std() + ADVANTAGE_EPS)
    return advantages
