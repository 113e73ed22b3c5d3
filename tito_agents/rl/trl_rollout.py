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
"""

from __future__ import annotations

import asyncio
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
from tito_agents.samples import Sample

Agent = Callable[[Any, Any], Awaitable[float | None]]
"""`async def agent(prompt, client) -> reward`: one rollout of `prompt` (what TRL's dataset row
holds: a string or a list of chat messages) through the collector-wrapped `client`. A None reward
keeps what the agent set on the episode itself (`tito_agents.current_episode().set_reward`)."""

T = TypeVar("T")

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
    """The collector's `policy_version` on each row's spans (the oldest one when they differ)."""


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
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class TrlRollout:
    """`rollout_func(prompts, trainer)` for TRL's `GRPOTrainer`, from `agent` and `collector`.

    collector: captures with logprobs (`capture_logprobs=True`; TRL's importance-sampling
        correction needs the old policy's) and merged assembly ("merged" or "both").
    client: the `openai.AsyncOpenAI` the collector wrapped, handed to `agent` on every call.
    max_concurrency: episodes in flight at once (None: the whole batch).
    sessions: token-in sessions for every episode (None: as the client was wrapped).
    timeout: seconds one `rollout_func` call may take (None: no limit).
    reward_key: the field the rewards go in (`passthrough_reward` reads "reward").

    After each call, `last_samples` holds the rows' samples (in row order) and `last_timings`
    what the call cost; `close()` stops the background loop (the collector is yours to close).
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
    ) -> None:
        settings = collector.settings
        if settings.assembly not in (AssemblyMode.MERGED, AssemblyMode.BOTH):
            raise ConfigurationError(
                "TrlRollout needs one sample per episode: create the collector with "
                f"assembly='merged' (it has {settings.assembly.value!r})"
            )
        if not settings.capture_logprobs:
            raise ConfigurationError(
                "TrlRollout returns the old policy's logprobs, which TRL's importance-sampling "
                "correction needs: create the collector with capture_logprobs=True"
            )
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.agent = agent
        self.collector = collector
        self.client = client
        self.max_concurrency = max_concurrency
        self.sessions = sessions
        self.timeout = timeout
        self.reward_key = reward_key
        self.last_samples: list[Sample] = []
        self.last_timings = RolloutTimings()
        self._batches = itertools.count()
        self._run_id = uuid.uuid4().hex[:8]
        self._loop: _LoopThread | None = None

    # ---- TRL's entry point ----

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """What `GRPOTrainer` calls: one row per entry of `prompts`, in order."""
        return self.run(prompts, num_generations_of(trainer))

    def run(self, prompts: Sequence[Any], num_generations: int) -> dict[str, list[Any]]:
        """`__call__` without a trainer: `prompts` in blocks of `num_generations` equal entries."""
        if self._loop is None:
            self._loop = _LoopThread()
        return self._loop.run(self.arun(prompts, num_generations), self.timeout)

    async def arun(self, prompts: Sequence[Any], num_generations: int) -> dict[str, list[Any]]:
        """`run` inside the caller's event loop (the client must live on that loop)."""
        check_prompt_blocks(prompts, num_generations)
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
        rolled = time.perf_counter()
        episodes: list[Episode] = []
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                result.add_note(f"(tito_agents.rl: in the rollout of prompt entry {index})")
                raise result
            episodes.append(result)
        samples = []
        for index, ep in enumerate(episodes):
            try:
                samples.append(episode_sample(ep))
            except EpisodeSplitError as exc:
                exc.add_note(f"(tito_agents.rl: in the rollout of prompt entry {index})")
                raise
        out = to_trl_rollout(samples, reward_key=self.reward_key, num_generations=num_generations)
        self.last_samples = samples
        self.last_timings = RolloutTimings(
            episodes=len(episodes),
            rollout_s=rolled - started,
            convert_s=time.perf_counter() - rolled,
            policy_versions=[oldest_version(s) for s in samples],
        )
        return out

    async def _episode(self, prompt: Any, group_id: str, index: int) -> Episode:
        async with self.collector.episode(
            group_id=group_id, sessions=self.sessions, metadata={"prompt_index": index}
        ) as ep:
            reward = await self.agent(prompt, self.client)
            if reward is not None:
                ep.set_reward(reward)
        return ep

    def close(self) -> None:
        """Stop the background event loop (idempotent)."""
        if self._loop is not None:
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
    if not fixes:
        fixes.append(SESSIONS_FIX)
    raise EpisodeSplitError(
        f"episode {ep.episode_id} gave {len(merged)} merged samples where TRL takes one "
        f"completion per rollout: {'; '.join(why) or 'its calls do not chain'}. Fix: "
        + "; or ".join(fixes)
    )


def oldest_version(sample: Sample) -> str | None:
    """The policy version of the sample's oldest span (None when unlabelled)."""
    versions = [s.policy_version for s in sample.spans if s.policy_version is not None]
    if not versions:
        return None
    return min(versions, key=lambda v: (0, int(v), v) if v.isdigit() else (1, 0, v))
