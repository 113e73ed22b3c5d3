"""Training with tito-agents: a TRL `rollout_func` over your agent, and new weights into the
running vLLM in place.

    from tito_agents.rl import TrlRollout, passthrough_reward, push_weights
    rollout = TrlRollout(agent, collector, client)           # async def agent(prompt, client)
    trainer = GRPOTrainer(..., rollout_func=rollout, reward_funcs=passthrough_reward)
    update = push_weights(model, "http://127.0.0.1:8000/v1", "out/weights", version=step)

A tools-layer package: it uses the public API (the collector, episodes, samples, converters)
and nothing of the capture internals. See docs/converters.md.
"""

from __future__ import annotations

from tito_agents.convert.trl import passthrough_reward
from tito_agents.rl.trl_rollout import Agent, EpisodeSplitError, RolloutTimings, TrlRollout
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
    "EpisodeSplitError",
    "RolloutTimings",
    "TrlRollout",
    "VllmWeights",
    "WeightRoutesMissing",
    "WeightSyncError",
    "WeightUpdate",
    "passthrough_reward",
    "push_weights",
    "save_weights",
]
