"""Training with tito-agents: a TRL `rollout_func` over your agent, and new weights into the
running vLLM in place.

    from tito_agents.rl import TrlRollout, passthrough_reward, push_weights
    rollout = TrlRollout(agent, collector, client)           # async def agent(prompt, client)
    trainer = GRPOTrainer(..., rollout_func=rollout, reward_funcs=passthrough_reward)
    update = push_weights(model, "http://127.0.0.1:8000/v1", "out/weights", version=step)

    from tito_agents.rl.trl_engine import attach_engine   # TRL uses the rollout logprobs,
    attach_engine(trainer, VLLM_URL, "out/weights", collector=collector)   # syncs each step

`TitoRolloutWorker` runs such an agent as TRL AsyncGRPO's `rollout_worker=`: it fills the
trainer's queue of `RolloutSample`s, TRL's weight transfer is kept (TRL is imported on `start`).

`VersionLog` reads which engine weights sampled each call off the updates' times (`versions`,
with the `max_staleness` filter); `trl_engine` and `trl_callback` need TRL / transformers and are
imported by name; both push through `sync` (gathered as the trainer shards, written by the main
process, awaited by every rank); `loop_plot` draws `make rl-loop`'s curves.

A tools-layer package: it uses the public API (the collector, episodes, samples, converters)
and nothing of the capture internals. See docs/rl-loop.md and docs/converters.md.
"""

from __future__ import annotations

from tito_agents.convert.trl import passthrough_reward
from tito_agents.rl.trl_async import TitoRolloutWorker
from tito_agents.rl.trl_rollout import Agent, EpisodeSplitError, RolloutTimings, TrlRollout
from tito_agents.rl.versions import (
    CallVersions,
    StalenessReport,
    VersionLog,
    filter_stale,
    relabel,
)
from tito_agents.rl.weights import (
    VllmWeights,
    WeightRoutesMissing,
    WeightSyncError,
    WeightUpdate,
    push_weights,
    save_weights,
)

__all__ = [
    "Agent",
    "CallVersions",
    "EpisodeSplitError",
    "RolloutTimings",
    "StalenessReport",
    "TitoRolloutWorker",
    "TrlRollout",
    "VersionLog",
    "VllmWeights",
    "WeightRoutesMissing",
    "WeightSyncError",
    "WeightUpdate",
    "filter_stale",
    "passthrough_reward",
    "push_weights",
    "relabel",
    "save_weights",
]
