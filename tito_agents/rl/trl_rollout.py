"""A TRL `GRPOTrainer` `rollout_func` built from an agent function and a `Collector`.

    async def agent(prompt, client) -> float | None: ...   # your agent; returns its reward

    collector = tito.Collector(capture_logprobs=True, assembly="merged")
    client = collector.wrap(openai.AsyncOpenAI(base_url=VLLM_URL, api_key="EMPTY"))
    rollout = TrlRollout(agent, collector, client)
    trainer = GRPOTrainer(..., rollout_func=rollout, reward_funcs=passthrough_reward)

What TRL 1.16 hands a `rollout_func` and wants back (`GRPOTrainer._generate`): the prompts of
this process, each already repeated `num_generations` times in a row by its sampler
(`RepeatSampler`, eval: `num_generations_eval`); back, one row per prompt entry, in order:
`prompt_ids`, `completion_ids`, `logprobs` (required), `env_mask` (popped as its tool mask: 1 =
the model sampled this token) and any other key, forwarded per row to the reward functions.
TRL normalises rewards within each block of `num_generations` consecutive rows.

So each call runs one episode per entry, every episode of the batch concurrently (a GRPO group is
one block of entries), and turns each episode's one merged sample into one row
(`convert.to_trl_rollout`): a multi-turn tool episode is one completion whose `env_mask` is 0 on
the tool results and template tokens between the model's turns, with the old-policy logprobs of
`Sample.ratio_logprobs()` and the agent's reward as the `reward` field (`passthrough_reward`).

An episode whose calls do not chain into one sequence (a re-tokenized or re-rendered history,
several agents, a rewrite) has several merged samples; TRL takes one completion per rollout, so it
is refused (`EpisodeSplitError`) with the reason and the fix: token-in sessions keep every turn an
exact extension of the last (`collector.wrap(client, sessions=True)` or `sessions=True` here).

The trainer calls `rollout_func` synchronously; the episodes run on an event loop of this object's
own (a background thread), so the async client stays on one loop for its whole life and the
trainer may itself run inside a loop. `arun` is the same in your own loop (do not mix the two).

Versions and staleness: with a `VersionLog` (`versions=`, fed by `attach_engine` or
`WeightSyncCallback`), each row's spans carry the engine version that sampled them (not the
collector's label at dispatch, wrong for a request held by a pause) and calls sampled by two
versions are counted; `max_staleness=N` sets the loss to 0 on spans older than `current - N`.

Async mode (`lag=1`, as AReaL and prime-rl run): the episodes of the prompts handed in at call k
run in the background while the trainer trains on the rows returned at call k, which are those of
call k-1's prompts (one step off-policy; the first call runs its prompts twice, once now and once
in the background, to fill the pipeline). TRL's reward functions still receive call k's prompts
beside them: the rewards come in the `reward` field, so `passthrough_reward` is unaffected.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tito_agents.calls import SessionNote
from tito_agents.collector import Collector
from tito_agents.config import AssemblyMode
from tito_agents.convert import ConversionError, to_trl_rollout
from tito_agents.episodes import Episode
from tito_agents.errors import ConfigurationError
from tito_agents.rl.versions import VersionLog, filter_stale, oldest_version, relabel
from tito_agents.samples import Sample

Rows = Callable[[list[Sample], list[Episode], int], dict[str, list[Any]]]
"""`rows(samples, episodes, num_generations)`: the rows TRL trains on (default: tito's own,
`to_trl_rollout`; a comparison can rebuild them another way, as a text pipeline would)."""

Agent = Callable[[Any, Any], Awaitable[float | None]]
"""`async def agent(prompt, client) -> reward`: one rollout of `prompt` (what TRL's dataset row
holds: a string or a list of chat messages) through the collector-wrapped `client`. A None reward
keeps what the agent set on the episode itself (`tito_agents.current_episode().set_reward`)."""

T = TypeVar("T")

AGENT_FIX = (
    "the agent must be `async def agent(prompt, client)` returning the episode's reward as a "
    "number, or None to keep the one it set on the episode"
)

SESSIONS_FIX = (
    "turn on token-in sessions so every turn's prompt extends the last exactly "
    "(collector.wrap(client, sessions=True), or TrlRollout(..., sessions=True))"
)


class EpisodeSplitError(ConversionError):
    """An episode gave several merged samples where TRL takes one completion per rollout."""


@dataclass(slots=True)
class RolloutTimings:
    """Where the seconds of one `rollout_func` call went."""

    episodes: int = 0
    rollout_s: float = 0.0
    """Running the episodes (the agent, the server, capture and assembly at each episode's end)."""
    convert_s: float = 0.0
    """Choosing the samples and laying them out for TRL (tito's own cost after the episodes)."""
    policy_versions: list[str | None] = field(default_factory=list)
    """The `policy_version` on each row's spans (the oldest one when they differ): the engine's
    version with a `VersionLog`, else the collector's label."""
    wait_s: float = 0.0
    """How long the trainer waited for the rows (with `lag=1`, less than `rollout_s`)."""
    straddling_calls: int = 0
    """Calls sampled partly by each of two weight versions (a `pause="keep"` update)."""
    mislabelled_calls: int = 0
    """Calls whose collector label is not the version that sampled them."""
    stale_tokens_masked: int = 0
    """Trained tokens set to loss 0 by `max_staleness`."""


async def _cancel_others() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _LoopThread:
    """An event loop on a daemon thread, for coroutines submitted from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="tito-rl-rollout", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):  # cancel what still runs (a lag-mode batch)
            asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def require_merged_logprobs(collector: Collector, merged_why: str, logprobs_why: str) -> None:
    """Refuse a collector a TRL adapter cannot build rows from: rows come from merged samples and
    carry the rollout logprobs (`ConfigurationError`, saying why and what to change)."""
    settings = collector.settings
    if settings.assembly not in (AssemblyMode.MERGED, AssemblyMode.BOTH):
        raise ConfigurationError(
            f"{merged_why}: create the collector with assembly='merged' "
            f"(it has {settings.assembly.value!r})"
        )
    if not settings.capture_logprobs:
        raise ConfigurationError(f"{logprobs_why}: create the collector with capture_logprobs=True")


class TrlRollout:
    """`rollout_func(prompts, trainer)` for TRL's `GRPOTrainer`, from `agent` and `collector`.

    collector: captures with logprobs (`capture_logprobs=True`; TRL's importance-sampling
        correction needs the old policy's) and merged assembly ("merged" or "both").
    client: the `openai.AsyncOpenAI` the collector wrapped, handed to `agent` on every call.
    max_concurrency: episodes in flight at once (None: the whole batch).
    sessions: token-in sessions for every episode (None: as the client was wrapped).
    timeout: seconds one `rollout_func` call may take (None: no limit).
    reward_key: the field the rewards go in (`passthrough_reward` reads "reward").
    versions: the engine's weight versions (`VersionLog`): spans get the version that sampled them.
    max_staleness: loss 0 on spans older than `versions.current - max_staleness` (needs versions).
    lag: 0 (synchronous) or 1 (async: rows of the previous call's prompts, see the module doc).
    rows: how samples become TRL rows (`Rows`; default `to_trl_rollout`).

    After each call, `last_samples` / `last_episodes` hold the rows' samples and episodes (in row
    order) and `last_timings` what the call cost; `close()` stops the background loop (the
    collector is yours to close).
    """

    def __init__(
        self,
        agent: Agent,
        collector: Collector,
        client: Any,
        *,
        max_concurrency: int | None = None,
        sessions: bool | None = None,
        timeout: float | None = None,
        reward_key: str = "reward",
        versions: VersionLog | None = None,
        max_staleness: int | None = None,
        lag: int = 0,
        rows: Rows | None = None,
    ) -> None:
        require_merged_logprobs(
            collector,
            "TrlRollout needs one sample per episode",
            "TrlRollout returns the old policy's logprobs, which TRL's importance-sampling "
            "correction needs",
        )
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if lag not in (0, 1):
            raise ValueError(f"lag must be 0 or 1, got {lag}")
        if max_staleness is not None and versions is None:
            raise ConfigurationError("max_staleness needs the engine's versions (versions=...)")
        self.agent = agent
        self.collector = collector
        self.client = client
        self.max_concurrency = max_concurrency
        self.sessions = sessions
        self.timeout = timeout
        self.reward_key = reward_key
        self.versions = versions
        self.max_staleness = max_staleness
        self.lag = lag
        self.rows = rows
        self.last_samples: list[Sample] = []
        self.last_episodes: list[Episode] = []
        self.last_timings = RolloutTimings()
        # lag=1: (entries, num_generations, concurrent future) of the next rows' episodes
        self._pending: tuple[int, int, Any] | None = None
        self._batches = itertools.count()
        self._run_id = uuid.uuid4().hex[:8]
        self._loop: _LoopThread | None = None

    # ---- TRL's entry point ----

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """What `GRPOTrainer` calls: one row per entry of `prompts`, in order."""
        return self.run(prompts, num_generations_of(trainer))

    def run(self, prompts: Sequence[Any], num_generations: int) -> dict[str, list[Any]]:
        """`__call__` without a trainer: `prompts` in blocks of `num_generations` equal entries."""
        check_prompt_blocks(prompts, num_generations)
        if self._loop is None:
            self._loop = _LoopThread()
        loop = self._loop
        started = time.perf_counter()
        shape = (len(prompts), num_generations)
        if self.lag and self._pending is None:  # fill the pipeline: these prompts now and below
            self._pending = (*shape, self._submit(prompts, num_generations))
        if self._pending is None or self._pending[:2] != shape:
            # lag=0, or a batch of another shape (TRL's evaluation) that the pending rows would
            # not line up with: these prompts run now, a pending batch waits for its shape
            episodes, rollout_s, _ = loop.run(
                self._episodes(prompts, num_generations), self.timeout
            )
        else:
            pending = self._pending[2]
            self._pending = None
            try:
                episodes, rollout_s, _ = pending.result(self.timeout)
            except TimeoutError:
                pending.cancel()  # not left running on the loop, unseen
                raise
            self._pending = (*shape, self._submit(prompts, num_generations))
        return self._to_rows(episodes, num_generations, rollout_s, time.perf_counter() - started)

    def _submit(self, prompts: Sequence[Any], num_generations: int) -> Any:
        """Start the episodes of `prompts` on the background loop (lag=1); their future."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(
            self._episodes(prompts, num_generations), self._loop.loop
        )

    async def arun(self, prompts: Sequence[Any], num_generations: int) -> dict[str, list[Any]]:
        """`run` inside the caller's event loop (the client must live on that loop; no lag)."""
        check_prompt_blocks(prompts, num_generations)
        started = time.perf_counter()
        episodes, rollout_s, _ = await self._episodes(prompts, num_generations)
        return self._to_rows(episodes, num_generations, rollout_s, time.perf_counter() - started)

    async def _episodes(
        self, prompts: Sequence[Any], num_generations: int
    ) -> tuple[list[Episode], float, int]:
        """Every entry's episode, concurrently: (episodes, seconds, num_generations)."""
        batch = f"{self._run_id}-{next(self._batches)}"
        gate = asyncio.Semaphore(self.max_concurrency or max(len(prompts), 1))
        started = time.perf_counter()

        async def one(index: int) -> Episode:
            async with gate:
                return await self._episode(
                    prompts[index], f"{batch}-g{index // num_generations}", index
                )

        results = await asyncio.gather(
            *(one(i) for i in range(len(prompts))), return_exceptions=True
        )
        seconds = time.perf_counter() - started
        episodes: list[Episode] = []
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                result.add_note(f"(tito_agents.rl: in the rollout of prompt entry {index})")
                raise result
            episodes.append(result)
        return episodes, seconds, num_generations

    def _to_rows(
        self, episodes: list[Episode], num_generations: int, rollout_s: float, wait_s: float
    ) -> dict[str, list[Any]]:
        converting = time.perf_counter()
        samples = []
        for index, ep in enumerate(episodes):
            try:
                samples.append(episode_sample(ep))
            except EpisodeSplitError as exc:
                exc.add_note(f"(tito_agents.rl: in the rollout of prompt entry {index})")
                raise
        straddling = mislabelled = masked = 0
        if self.versions is not None:
            calls = self.versions.of_calls(c for ep in episodes for c in ep.calls)
            straddling = sum(v.straddles for v in calls.values())
            mislabelled = sum(v.mislabelled for v in calls.values())
            samples = [relabel(s, calls) for s in samples]
            current = self.versions.current
            # before the first update every call was sampled by the current weights: nothing is
            # stale, whatever the initial label (vLLM's own is "default", not a step number)
            if self.max_staleness is not None and current is not None and self.versions.updates:
                samples, report = filter_stale(samples, current, self.max_staleness, mode="mask")
                masked = report.masked_tokens
        if self.rows is not None:
            out = self.rows(samples, episodes, num_generations)
        else:
            out = to_trl_rollout(
                samples, reward_key=self.reward_key, num_generations=num_generations
            )
        self.last_samples = samples
        self.last_episodes = episodes
        self.last_timings = RolloutTimings(
            episodes=len(episodes),
            rollout_s=rollout_s,
            convert_s=time.perf_counter() - converting,
            policy_versions=[oldest_version(s) for s in samples],
            wait_s=wait_s,
            straddling_calls=straddling,
            mislabelled_calls=mislabelled,
            stale_tokens_masked=masked,
        )
        return out

    async def _episode(self, prompt: Any, group_id: str, index: int) -> Episode:
        async with self.collector.episode(
            group_id=group_id, sessions=self.sessions, metadata={"prompt_index": index}
        ) as ep:
            running = self.agent(prompt, self.client)
            if not inspect.isawaitable(running):  # a plain `def`: `await` would not say why
                raise TypeError(f"the agent returned {type(running).__name__}: {AGENT_FIX}")
            reward = await running
            if reward is not None:
                try:
                    float(reward)
                except (TypeError, ValueError):
                    raise TypeError(f"the agent returned {reward!r}: {AGENT_FIX}") from None
                ep.set_reward(reward)
        return ep

    def close(self, *, client: bool = False) -> None:
        """Stop the background event loop (idempotent; a later call starts a new one); a
        lag-mode batch in flight is dropped. `client=True` also closes the async client: its
        connections were opened on that loop, so its `close()` is awaited there (nothing else
        can close them without "unclosed socket" warnings)."""
        self._pending = None
        if self._loop is not None:
            closer = getattr(self.client, "close", None) if client else None
            if closer is not None and inspect.iscoroutinefunction(closer):
                with contextlib.suppress(Exception):
                    self._loop.run(closer(), 30)
            self._loop.close()
            self._loop = None

    def __enter__(self) -> TrlRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def num_generations_of(trainer: Any) -> int:
    """How many rows per prompt TRL expects now: `num_generations` in training,
    `num_generations_eval` in evaluation (TRL's `_generate` decides by `model.training`)."""
    model = getattr(trainer, "model", None)
    training = bool(getattr(model, "training", True))
    value = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
    if value is None:
        value = trainer.num_generations
    return int(value)


def check_prompt_blocks(prompts: Sequence[Any], num_generations: int) -> None:
    """Raise `ValueError` unless `prompts` are whole blocks of `num_generations` equal entries
    (what TRL's sampler gives: each block becomes one GRPO group)."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    if not prompts or len(prompts) % num_generations:
        raise ValueError(
            f"{len(prompts)} prompt entries are not whole blocks of "
            f"num_generations={num_generations} (TRL repeats each prompt that many times in a row)"
        )
    for start in range(0, len(prompts), num_generations):
        block = prompts[start : start + num_generations]
        if any(entry != block[0] for entry in block[1:]):
            raise ValueError(
                f"prompt entries {start}-{start + num_generations - 1} differ: each block of "
                "num_generations entries must repeat one prompt (one GRPO group)"
            )


def episode_sample(ep: Episode) -> Sample:
    """The one merged sample of an ended episode, or `EpisodeSplitError` saying why there is not
    exactly one and what to change."""
    merged = [s for s in ep.samples if s.view == "merged"]
    if len(merged) == 1:
        return merged[0]
    if not merged:
        raise EpisodeSplitError(
            f"episode {ep.episode_id}: no sample (the agent made no captured call; wrap the "
            "client it uses with collector.wrap)"
        )
    reasons = sorted({d.kind.value for d in ep.divergences})
    agents = sorted({str(s.agent) for s in merged})
    why = []
    if reasons:
        where = "; ".join(
            f"call {d.call_id} does not extend call {d.prev_call_id} ({d.kind.value})"
            for d in ep.divergences[:3]
        )
        why.append(f"its history diverged: {where}")
    if len(agents) > 1:
        why.append(f"it ran several agents ({', '.join(agents)}), one sequence each")
    fallbacks = sorted(
        {
            c.session_reason
            for c in ep.calls
            if c.session is SessionNote.FALLBACK and c.session_reason
        }
    )
    if fallbacks:  # sessions were on, but these calls were rendered by the server
        why.append(f"token-in sessions fell back ({'; '.join(fallbacks)})")
    fixes = []
    # "other": the sampled turn came back with other ids, the usual server re-rendering
    if set(reasons) & {"retokenized", "template_rerender", "truncation", "other"}:
        fixes.append(SESSIONS_FIX)
    if set(reasons) & {"history_rewrite", "branch", "resample"} or len(agents) > 1:
        fixes.append(
            "make the episode one linear conversation of one agent (the same tools on every "
            "call, no edited or trimmed history, no parallel or repeated calls of one prompt)"
        )
    if "policy_switch" in reasons:
        fixes.append(
            "keep each agent on one policy for a whole episode (change Collector(policies=...) "
            "between episodes)"
        )
    if not fixes:
        fixes.append(SESSIONS_FIX)
    raise EpisodeSplitError(
        f"episode {ep.episode_id} gave {len(merged)} merged samples where TRL takes one "
        f"completion per rollout: {'; '.join(why) or 'its calls do not chain'}. Fix: "
        + "; or ".join(fixes)
    )
