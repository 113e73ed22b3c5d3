"""A verl agent loop that runs your unmodified agent through tito capture.

    async def agent(prompt, client) -> float | None: ...   # your agent; returns its reward

verl (0.9.1) picks an agent loop per dataset row by the row's `agent_name`; this module registers
`TitoAgentLoop` under "tito_agent" in verl's registry, and a YAML entry names your agent:

    # agent_loops.yaml  (actor_rollout_ref.rollout.agent.agent_loop_config_path)
    - name: my_agent
      _target_: tito_agents.rl.verl_loop.TitoAgentLoop
      agent: my_project.agents:solve

Each `run` is one episode: the loop takes a rollout server from verl's load balancer (the one
`LLMServerClient` would send the request to; its id is that server's OpenAI-compatible HTTP
address), hands the agent an `openai.AsyncOpenAI` on it wrapped by a process-wide `Collector`
(logprobs on, merged assembly), and turns the episode's merged sample into an `AgentLoopOutput`
(`convert.to_agent_loop_outputs`): prompt ids, response ids with mask 0 on tool results and
template tokens, the sampled tokens' logprobs, the reward, and `min_global_steps` /
`max_global_steps` (the weight version: the row's `global_steps`, which verl's v1 trainer hands the
loop; they stay unset under the classic trainer, which does not read them).

The agent gets the row's `raw_prompt` (chat messages) and the client, plus any other dataset
field it names as a keyword (`reward_model`, `extra_info`, `data_source`, ... or `**fields`), and
`base_url` (the server's) and `collector` (the loop's), for a framework agent that builds its own
model client (LangChain's `wrap(ChatOpenAI(base_url=base_url, ...), collector)`).

Linked segments (an episode whose calls do not chain into one sequence: several agents, a
rewritten history) become one row each, every row with the episode's reward, where the worker
takes a list (v1's `AgentLoopWorkerTQ`, which passes `session_id`); the classic `AgentLoopWorker`
takes one output per run, so there such an episode is refused as below, with the reason.

A failed episode (the agent raised, made no captured call, returned a reward that is not a finite
number, or gave segments the worker cannot take) never raises into verl's worker: it becomes a row
that trains nothing (response mask all 0, reward 0.0, logprobs 0.0) whose
`extra_fields["tito_failure"]` says why; the reason is logged and counted in `FAILURES`. Its
reward 0.0 counts in its GRPO group like a failed attempt's.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import verl

from tito_agents.convert import to_agent_loop_outputs
from tito_agents.errors import ConfigurationError
from tito_agents.rl.agent_episode import (
    Agent,
    EpisodeFailure,
    load_agent,
    run_episode,
)
from tito_agents.samples import Sample

SUPPORTED_VERL = ("0.9.1",)
"""The verl releases this loop is tested against (its agent-loop API changes between releases)."""


def check_verl_version(version: str) -> None:
    """Refuse a verl release this loop was not built against, naming those it was."""
    if version not in SUPPORTED_VERL:
        raise ImportError(
            f"tito_agents.rl.verl_loop supports verl {', '.join(SUPPORTED_VERL)}, "
            f"not {version}: pip install 'verl=={SUPPORTED_VERL[-1]}'"
        )


check_verl_version(verl.__version__)

from verl.experimental.agent_loop.agent_loop import (  # noqa: E402  (after the version check)
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

logger = logging.getLogger(__name__)

FAILURES: Counter[str] = Counter()
"""Failed episodes in this process, by kind ("agent_error", "no_call", "bad_reward",
"segments", "no_prompt")."""


def prompt_of(row: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    """The row's `raw_prompt` as the agent gets it: a list of chat messages (verl's batch holds it
    as a numpy object array, which an openai client cannot send), or a plain string."""
    raw = row.get("raw_prompt")
    if raw is None:
        raise EpisodeFailure("no_prompt", "the dataset row has no raw_prompt")
    return raw if isinstance(raw, str) else [dict(message) for message in raw]


def global_steps_of(row: Mapping[str, Any]) -> int | None:
    """The row's `global_steps` (v1 hands it to the loop as a 0-d tensor or number)."""
    value = row.get("global_steps")
    return None if value is None else int(value)


@register("tito_agent")
class TitoAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """Runs an agent function (YAML `agent: module:function`, or a subclass's `agent`) as a verl
    agent loop. YAML options: `base_url` (a server of your own instead of verl's rollout
    servers), `sessions` (token-in sessions: every turn's prompt extends the last exactly, so a
    multi-turn episode stays one row)."""

    agent: ClassVar[Agent | None] = None

    def __init__(
        self,
        *args: Any,
        agent: str | None = None,
        base_url: str | None = None,
        sessions: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        chosen = load_agent(agent) if agent else type(self).agent
        if chosen is None:
            raise ConfigurationError(
                "TitoAgentLoop has no agent: name one in the agent loop YAML "
                "(agent: module:function) or set `agent` on a subclass"
            )
        self._agent: Agent = chosen
        self._base_url = base_url
        self._sessions = sessions

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One episode of the agent on the row's prompt; its rows, or a failed row saying why."""
        steps = global_steps_of(kwargs)
        try:
            prompt = prompt_of(kwargs)
            samples = await self._episode(prompt, kwargs)
            if len(samples) > 1 and "session_id" not in kwargs:
                raise EpisodeFailure(
                    "segments",
                    f"the episode gave {len(samples)} linked segments and this verl worker takes "
                    "one output per run: use verl's v1 trainer (one row per segment) or token-in "
                    "sessions (sessions: true) so the turns chain into one sequence",
                )
            outputs = [self._output(record, steps) for record in to_agent_loop_outputs(samples)]
        except EpisodeFailure as failure:
            FAILURES[failure.kind] += 1
            logger.warning("tito_agent: episode gives no trainable row: %s", failure)
            return self._failed_output(kwargs.get("raw_prompt"), str(failure), steps)
        return outputs if len(outputs) > 1 else outputs[0]

    async def _episode(self, prompt: Any, row: Mapping[str, Any]) -> list[Sample]:
        group = str(row.get("uid", row.get("index", uuid.uuid4().hex)))
        fields = {k: v for k, v in row.items() if k != "raw_prompt"}
        async with self._server(uuid.uuid4().hex) as base_url:
            return await run_episode(
                self._agent,
                prompt,
                fields,
                base_url=base_url,
                group_id=group,
                sessions=self._sessions,
            )

    @contextlib.asynccontextmanager
    async def _server(self, request_id: str) -> AsyncIterator[str]:
        """The OpenAI base URL of the rollout server verl's load balancer picks for this episode
        (held for the whole episode, so its turns share the server's prefix cache)."""
        if self._base_url is not None:
            yield self._base_url
            return
        server_id, _ = await self.server_manager._acquire_server(request_id)
        try:
            yield f"http://{server_id}/v1"
        finally:
            self.server_manager._release_server(server_id, request_id=request_id)

    def _output(self, record: dict[str, Any], steps: int | None) -> AgentLoopOutput:
        # every row carries the key (None here): verl concatenates batches on a stable key set;
        # v1's worker copies the last row's `reward_extra_info` to a list's other rows (it is
        # only set when verl computed the reward)
        extra = {**record.pop("extra_fields"), "tito_failure": None, "reward_extra_info": {}}
        if steps is not None:
            extra.update(min_global_steps=steps, max_global_steps=steps)
        record["metrics"] = AgentLoopMetrics()
        # verl pads to rollout.prompt_length / response_length and cannot take longer rows: cut
        # them as verl's own loops do (the oldest prompt tokens, the response's tail)
        record["prompt_ids"] = self._cap_text_prompt_length(record["prompt_ids"])
        limit = int(self.rollout_config.response_length)
        if len(record["response_ids"]) > limit:
            logger.warning(
                "tito_agent: response of %d tokens exceeds rollout.response_length=%d; cut",
                len(record["response_ids"]),
                limit,
            )
            for key in ("response_ids", "response_mask", "response_logprobs"):
                if record[key] is not None:
                    record[key] = record[key][:limit]
        return AgentLoopOutput(**record, extra_fields=extra)

    def _failed_output(self, prompt: Any, reason: str, steps: int | None) -> AgentLoopOutput:
        """A row verl pads and batches like any other that trains nothing."""
        end = self.tokenizer.eos_token_id
        if prompt is None:
            prompt_ids = [0 if end is None else int(end)]
        elif isinstance(prompt, str):
            prompt_ids = list(self.tokenizer.encode(prompt))
        else:
            prompt_ids = list(
                self.tokenizer.apply_chat_template(
                    [dict(message) for message in prompt],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            )
        extra: dict[str, Any] = {"tito_failure": reason, "reward_extra_info": {}}
        if steps is not None:
            extra.update(min_global_steps=steps, max_global_steps=steps)
        return AgentLoopOutput(
            prompt_ids=self._cap_text_prompt_length(prompt_ids),
            response_ids=[0 if end is None else int(end)],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=0.0,
            num_turns=0,
            metrics=AgentLoopMetrics(),
            extra_fields=extra,
        )
