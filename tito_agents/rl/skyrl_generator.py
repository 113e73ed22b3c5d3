"""A SkyRL generator that runs your unmodified agent through tito capture.

    async def agent(prompt, client) -> float | None: ...   # your agent; returns its reward

SkyRL (0.4.0) asks its generator for a batch of trajectories: `generate(GeneratorInput) ->
GeneratorOutput`. `TitoGenerator` runs the agent once per prompt, concurrently, each run a tito
episode against SkyRL's inference endpoint (`inference_engine_client.get_endpoint_url()`, its
OpenAI-compatible router), through an `openai.AsyncOpenAI` wrapped by the process's collector
(logprobs on, merged assembly), and returns what vLLM sampled: prompt ids, response ids with loss
mask 0 on tool results and template tokens, the sampled tokens' logprobs, the reward
(`convert.to_skyrl_steps`). Plug it in through SkyRL's experiment class:

    class MyExp(BasePPOExp):
        def get_generator(self, cfg, tokenizer, inference_engine_client):
            return TitoGenerator(my_agent, tokenizer=tokenizer,
                                 inference_engine_client=inference_engine_client,
                                 step_wise=cfg.generator.step_wise_trajectories)

The agent gets the prompt (chat messages) and the client, plus what it names as a keyword among
the prompt's `env_extras` (`reward_spec`, `extra_info`, ...), `env_class`, `sampling_params`,
`trajectory_id`, `batch_metadata`, `model` (the served model's name), `base_url` and `collector`.

Linked segments (an episode whose calls do not chain into one sequence: several agents, a
rewritten history) are steps under `step_wise=True` (SkyRL's `generator.step_wise_trajectories`):
one row each, adjacent, `is_last_step` on the last, one `TrajectoryID`. Without step-wise rows a
trajectory is one row, so there such an episode is refused as below, the reason naming the fix.

A failed episode (no chat messages to start from, the agent raised, made no captured call,
returned a reward that is not a finite number, or gave segments the trainer cannot take) never
raises into SkyRL's loop: it becomes a row that trains nothing (loss mask all 0, reward 0.0,
logprobs 0.0, stop reason "error"); the reason is logged and counted in `FAILURES` and in the
batch's `rollout_metrics`. Its reward 0.0 counts in its GRPO group like a failed attempt's; a
group whose rewards are all equal gets advantage 0 from SkyRL's own estimator.

`rollout_sample_support` and `rollout_expert_indices` stay None: vLLM's OpenAI-compatible
responses carry neither the sampler's support nor the routed experts (SkyRL's own generator reads
them from its engine client, not over HTTP).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import skyrl

from tito_agents.convert import to_skyrl_steps
from tito_agents.errors import ConfigurationError
from tito_agents.rl.agent_episode import (
    Agent,
    EpisodeFailure,
    load_agent,
    run_episode,
)

SUPPORTED_SKYRL = ("0.4.0",)
"""The skyrl releases this generator is tested against (its generator types change between
releases)."""


def check_skyrl_version(version: str) -> None:
    """Refuse a skyrl release this generator was not built against, naming those it was."""
    if version not in SUPPORTED_SKYRL:
        raise ImportError(
            f"tito_agents.rl.skyrl_generator supports skyrl {', '.join(SUPPORTED_SKYRL)}, "
            f"not {version}: pip install 'skyrl=={SUPPORTED_SKYRL[-1]}'"
        )


check_skyrl_version(skyrl.__version__)

from skyrl.train.generators.base import (  # noqa: E402  (after the version check)
    GeneratorInput,
    GeneratorInterface,
    GeneratorOutput,
    TrajectoryID,
)

logger = logging.getLogger(__name__)

FAILURES: Counter[str] = Counter()
"""Failed episodes in this process, by kind ("agent_error", "no_call", "bad_reward",
"segments", "no_prompt")."""

FAILED_STOP_REASON = "error"
"""The stop reason of a row that trains nothing (SkyRL's overlong filtering and
`zero_reward_on_non_stop` treat it as not "stop", which changes nothing on such a row)."""


def messages_of(prompt: object) -> list[dict[str, Any]]:
    """The prompt as the agent gets it: SkyRL's `ConversationType`, a list of chat messages, as
    plain dicts; `EpisodeFailure` for anything else."""
    if not isinstance(prompt, Sequence) or isinstance(prompt, str) or not prompt:
        raise EpisodeFailure("no_prompt", f"the prompt is {prompt!r}, not a list of chat messages")
    if not all(isinstance(message, Mapping) for message in prompt):
        raise EpisodeFailure("no_prompt", "the prompt holds something other than chat messages")
    return [dict(message) for message in prompt]


def openai_base_url(endpoint: str) -> str:
    """The OpenAI base URL of SkyRL's data-plane endpoint (`get_endpoint_url()` is the router's
    root; the OpenAI routes live under /v1)."""
    root = endpoint.rstrip("/")
    return root if root.endswith("/v1") else f"{root}/v1"


class TitoGenerator(GeneratorInterface):  # type: ignore[misc]
    """SkyRL's `GeneratorInterface` over an agent function (`module:function` or the function).

    `tokenizer`: the policy's (SkyRL hands it to `get_generator`), for the prompt of a row that
    trains nothing. The server: `inference_engine_client` (its endpoint and model name), or
    `base_url` (a server of your own) with `model`. `step_wise`: SkyRL's
    `generator.step_wise_trajectories` (linked segments become steps). `sessions`: token-in
    sessions, so every turn's prompt extends the last exactly and a multi-turn episode stays one
    row. `max_concurrency`: episodes run at once (default: the whole batch)."""

    def __init__(
        self,
        agent: Agent | str,
        *,
        tokenizer: Any,
        inference_engine_client: Any = None,
        base_url: str | None = None,
        model: str | None = None,
        step_wise: bool = False,
        sessions: bool | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        if (inference_engine_client is None) == (base_url is None):
            raise ConfigurationError(
                "TitoGenerator needs the server: inference_engine_client (SkyRL's) or base_url"
            )
        if max_concurrency is not None and max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be at least 1, not {max_concurrency}")
        self._agent: Agent = load_agent(agent) if isinstance(agent, str) else agent
        self._tokenizer = tokenizer
        if inference_engine_client is not None:
            base_url = openai_base_url(inference_engine_client.get_endpoint_url())
            model = model or inference_engine_client.model_name
        assert base_url is not None
        self._base_url = base_url
        self._model = model
        self._step_wise = step_wise
        self._sessions = sessions
        self._max_concurrency = max_concurrency

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """One episode per prompt, in the batch's order; every prompt gives at least one row."""
        prompts = input_batch["prompts"]
        count = len(prompts)
        extras = input_batch.get("env_extras") or [{}] * count
        env_classes = input_batch.get("env_classes") or [None] * count
        ids = input_batch.get("trajectory_ids") or [
            TrajectoryID(instance_id=uuid.uuid4().hex, repetition_id=0) for _ in range(count)
        ]
        shared = {
            "sampling_params": input_batch.get("sampling_params"),
            "batch_metadata": input_batch.get("batch_metadata"),
        }
        if self._model is not None:
            shared["model"] = self._model
        # one per call: an asyncio semaphore belongs to the event loop it first waits in
        limit = asyncio.Semaphore(self._max_concurrency or count or 1)
        trajectories = await asyncio.gather(
            *(
                self._bounded(
                    limit,
                    prompts[i],
                    {**(extras[i] or {}), **shared, "env_class": env_classes[i]},
                    ids[i],
                )
                for i in range(count)
            )
        )
        return self._output(trajectories)

    async def _bounded(
        self,
        limit: asyncio.Semaphore,
        prompt: Any,
        fields: dict[str, Any],
        trajectory_id: TrajectoryID,
    ) -> tuple[TrajectoryID, list[dict[str, Any]], str | None]:
        async with limit:
            return await self._trajectory(prompt, fields, trajectory_id)

    async def _trajectory(
        self, prompt: Any, fields: dict[str, Any], trajectory_id: TrajectoryID
    ) -> tuple[TrajectoryID, list[dict[str, Any]], str | None]:
        """The trajectory's rows and, for a failed episode, its failure kind."""
        try:
            samples = await run_episode(
                self._agent,
                messages_of(prompt),
                {**fields, "trajectory_id": trajectory_id},
                base_url=self._base_url,
                group_id=str(trajectory_id.instance_id),
                sessions=self._sessions,
            )
            if len(samples) > 1 and not self._step_wise:
                raise EpisodeFailure(
                    "segments",
                    f"the episode gave {len(samples)} linked segments and SkyRL without step-wise "
                    "rows takes one row per trajectory: set generator.step_wise_trajectories=true "
                    "(one step per segment) or use token-in sessions (sessions=True) so the turns "
                    "chain into one sequence",
                )
            return trajectory_id, to_skyrl_steps(samples), None
        except EpisodeFailure as failure:
            FAILURES[failure.kind] += 1
            logger.warning("tito generator: episode gives no trainable row: %s", failure)
            return trajectory_id, [self._failed_row(prompt)], failure.kind

    def _failed_row(self, prompt: object) -> dict[str, Any]:
        """A row SkyRL pads and batches like any other that trains nothing (its prompt rendered
        as the policy's chat template renders it, where it is a list of chat messages)."""
        end = self._tokenizer.eos_token_id
        filler = 0 if end is None else int(end)
        try:
            messages = messages_of(prompt)
        except EpisodeFailure:
            messages = []
        prompt_ids = (
            list(
                self._tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            if messages
            else []
        )
        return {
            "prompt_token_ids": prompt_ids or [filler],
            "response_ids": [filler],
            "loss_mask": [0],
            "rollout_logprobs": [0.0],
            "reward": 0.0,
            "stop_reason": FAILED_STOP_REASON,
            "is_last_step": True,
        }

    def _output(
        self, trajectories: Sequence[tuple[TrajectoryID, list[dict[str, Any]], str | None]]
    ) -> GeneratorOutput:
        rows = [(tid, row) for tid, steps, _ in trajectories for row in steps]
        logprobs = [row["rollout_logprobs"] for _, row in rows]
        if any(lp is None for lp in logprobs):
            logger.warning("tito generator: some rows have no rollout logprobs; none are returned")
        failed = Counter(kind for _, _, kind in trajectories if kind is not None)
        metrics: dict[str, Any] = {"tito/failed_trajectories": sum(failed.values())}
        metrics.update({f"tito/failures/{kind}": n for kind, n in failed.items()})
        return {
            "prompt_token_ids": [row["prompt_token_ids"] for _, row in rows],
            "response_ids": [row["response_ids"] for _, row in rows],
            "rewards": [row["reward"] for _, row in rows],
            "loss_masks": [row["loss_mask"] for _, row in rows],
            "stop_reasons": [row["stop_reason"] for _, row in rows],
            "rollout_metrics": metrics,
            "rollout_logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            "trajectory_ids": [tid for tid, _ in rows],
            "trajectory_generation_times": None,
            "trajectory_time_splits": None,
            "rollout_expert_indices": None,
            "rollout_sample_support": None,
            "is_last_step": [row["is_last_step"] for _, row in rows] if self._step_wise else None,
            "env_metrics": None,
            "pixel_values": None,
            "image_grid_thw": None,
        }
