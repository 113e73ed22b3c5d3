"""Trainer hand-off: samples laid out the way verl, TRL and generic trainers consume them.

Pure functions over `tito_agents.Sample` objects; numpy out (torch via `.to_torch()` when torch is
installed); the samples are never modified and stay unshifted.

    from tito_agents.convert import to_verl_batch, to_trl_rollout, pad_batch, pack_batch
    batch = to_verl_batch(samples)               # verl agent-loop fields + uid
    rows = to_skyrl_steps(samples)               # SkyRL GeneratorOutput rows (step-wise)
    out = to_trl_rollout(samples)                # what a TRL GRPOTrainer rollout_func returns
    padded = pad_batch(samples, padding_side="right")
    packed = pack_batch(samples, advantages=group_advantages(samples))

Behaviour logprobs (`behaviour_logprobs`): a sampled token's logprob under the distribution the
engine sampled from (temperature, min-p, top-k, top-p as vLLM applies them), needed wherever a span
was sampled tempered or truncated (`needs_behaviour_logprobs`).

See docs/converters.md for every field and where each token, mask bit and logprob lands.
"""

from __future__ import annotations

from tito_agents.convert._arrays import IGNORE_INDEX, torch_available
from tito_agents.convert._sample_fields import (
    ConversionError,
    group_key,
    policy_version_of,
    prompt_length,
    stable_int_id,
)
from tito_agents.convert.advantages import group_advantages
from tito_agents.convert.batch import (
    PaddedBatch,
    ShiftedTargets,
    SplitBatch,
    pad_batch,
    pad_split_batch,
)
from tito_agents.convert.behaviour import (
    BehaviourLogprobs,
    SamplingParams,
    TokenSampling,
    behaviour_logprobs,
    behaviour_logprobs_torch,
    needs_behaviour_logprobs,
)
from tito_agents.convert.packing import PackedBatch, pack_batch, pack_batches
from tito_agents.convert.skyrl import to_skyrl_steps
from tito_agents.convert.trl import (
    TrlRolloutSampleFields,
    check_generation_blocks,
    passthrough_reward,
    to_trl_rollout,
    to_trl_rollout_samples,
)
from tito_agents.convert.verl import VerlBatch, to_agent_loop_outputs, to_verl_batch

__all__ = [
    "IGNORE_INDEX",
    "BehaviourLogprobs",
    "ConversionError",
    "PackedBatch",
    "PaddedBatch",
    "SamplingParams",
    "ShiftedTargets",
    "SplitBatch",
    "TokenSampling",
    "TrlRolloutSampleFields",
    "VerlBatch",
    "behaviour_logprobs",
    "behaviour_logprobs_torch",
    "check_generation_blocks",
    "group_advantages",
    "group_key",
    "needs_behaviour_logprobs",
    "pack_batch",
    "pack_batches",
    "pad_batch",
    "pad_split_batch",
    "passthrough_reward",
    "policy_version_of",
    "prompt_length",
    "stable_int_id",
    "to_agent_loop_outputs",
    "to_skyrl_steps",
    "to_trl_rollout",
    "to_trl_rollout_samples",
    "to_verl_batch",
    "torch_available",
]
