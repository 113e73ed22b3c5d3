"""verl hand-off: the agent-loop batch (`DataProto` fields) and `AgentLoopOutput`-shaped records.

Field contract (verl 0.9 `verl/experimental/agent_loop/agent_loop.py`, `AgentLoopWorker.
_agent_loop_postprocess` and `_postprocess`):

* `prompts` `[B, P]` left-padded, `responses` `[B, R]` right-padded, `input_ids` = their
  concatenation, `attention_mask` likewise, `position_ids = clip(cumsum(attention_mask) - 1, 0)`.
* `response_mask` `[B, R]`: 1 on tokens the policy sampled, 0 on tool results / template / later user
  turns inside the response and on pads. `rollout_log_probs` `[B, R]`, 0.0 off the sampled tokens
  (present only when every sample captured logprobs, as verl requires of every row).
* `rm_scores` `[B, R]`: the sample's reward at its last valid response token, 0 elsewhere (present
  only when every sample has a reward).
* `non_tensor_batch["uid"]`: the GRPO group (`group_key`), plus `__num_turns__` and provenance;
  `trajectory_id` / `segment_index` keep a compacted agent's segments together (docs/converters.md,
  "Trajectories"; `segment_index` -1 on per-call samples).

The split is the sample's first sampled token (`prompt_length`): for a merged multi-turn sample the
first call's prompt is the prompt, and every later token, sampled or not, is response with its
mask. Arrays are unshifted, as verl wants them. Nothing is truncated unless asked (`overflow`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert._arrays import Overflow, to_torch
from tito_agents.convert._sample_fields import (
    group_key,
    require_one_view,
    require_samples,
    reward_of,
)
from tito_agents.convert._sample_fields import prompt_length as split_point
from tito_agents.convert.advantages import trajectory_of
from tito_agents.convert.batch import SplitBatch, pad_split_batch
from tito_agents.errors import ConfigurationError
from tito_agents.samples import Sample


@dataclass(frozen=True, slots=True)
class VerlBatch:
    """A verl agent-loop batch: `tensors()` is its `TensorDict`, `non_tensors()` its
    `non_tensor_batch`; `to_data_proto()` builds the `DataProto` when verl is installed."""

    split: SplitBatch
    rm_scores: npt.NDArray[np.float32] | None
    uid: npt.NDArray[np.object_]
    num_turns: npt.NDArray[np.int32]
    """LLM calls per sample (verl counts chat turns; each call here is one assistant turn)."""
    episode_ids: npt.NDArray[np.object_]
    trajectory_ids: npt.NDArray[np.object_] | None = None
    """`trajectory_of` each sample: one id for all segments of one agent's trajectory."""
    segment_indices: npt.NDArray[np.int32] | None = None
    """Each sample's `segment_index` in its trajectory, -1 where it has none (per-call)."""

    @property
    def prompts(self) -> npt.NDArray[np.int32]:
        return self.split.prompt_ids

    @property
    def responses(self) -> npt.NDArray[np.int32]:
        return self.split.response_ids

    @property
    def response_mask(self) -> npt.NDArray[np.uint8]:
        return self.split.response_loss_mask

    @property
    def input_ids(self) -> npt.NDArray[np.int32]:
        return self.split.input_ids

    @property
    def attention_mask(self) -> npt.NDArray[np.uint8]:
        return self.split.attention_mask

    @property
    def position_ids(self) -> npt.NDArray[np.int32]:
        return self.split.position_ids

    @property
    def rollout_log_probs(self) -> npt.NDArray[np.float32] | None:
        return self.split.response_logprobs

    def tensors(self) -> dict[str, npt.NDArray[Any]]:
        """The batch fields under verl's names (`rollout_log_probs` / `rm_scores` when present)."""
        out: dict[str, npt.NDArray[Any]] = {
            "prompts": self.prompts,
            "responses": self.responses,
            "response_mask": self.response_mask,
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }
        if self.rollout_log_probs is not None:
            out["rollout_log_probs"] = self.rollout_log_probs
        if self.rm_scores is not None:
            out["rm_scores"] = self.rm_scores
        constrained = self.split.response_constrained_mask
        if constrained is not None:  # an extra tensor verl carries along; see docs/converters.md
            out["constrained_mask"] = constrained
        out.update(self.split.response_sampling())  # [B, R] temperature, top_p, top_k, min_p
        return out

    def non_tensors(self) -> dict[str, npt.NDArray[Any]]:
        """`uid` (GRPO group), `__num_turns__`, and `sample_id` / `episode_id` /
        `trajectory_id` / `segment_index` for provenance and per-trajectory advantages."""
        out: dict[str, npt.NDArray[Any]] = {
            "uid": self.uid,
            "__num_turns__": self.num_turns,
            "sample_id": np.array(self.split.sample_ids, dtype=object),
            "episode_id": self.episode_ids,
        }
        if self.trajectory_ids is not None:
            out["trajectory_id"] = self.trajectory_ids
        if self.segment_indices is not None:
            out["segment_index"] = self.segment_indices
        return out

    def to_torch(self) -> dict[str, Any]:
        """`tensors()` as torch tensors with verl's dtypes (int64 ids/masks/positions, float32)."""
        return to_torch(self.tensors())

    def to_data_proto(self, meta_info: dict[str, Any] | None = None) -> Any:
        """A `verl.protocol.DataProto` of this batch (needs verl installed)."""
        try:
            protocol = importlib.import_module("verl.protocol")
        except ImportError as exc:
            raise ConfigurationError(
                "to_data_proto needs verl, which is not installed: pip install verl "
                "(or hand tensors() / non_tensors() to your own DataProto builder)"
            ) from exc
        return protocol.DataProto.from_dict(
            tensors=self.to_torch(), non_tensors=self.non_tensors(), meta_info=meta_info or {}
        )


def to_verl_batch(
    samples: Sequence[Sample],
    *,
    pad_id: int = 0,
    prompt_length: int | None = None,
    response_length: int | None = None,
    overflow: Overflow = "error",
) -> VerlBatch:
    """The verl agent-loop batch of `samples`, in order.

    `prompt_length` / `response_length` are verl's `rollout.prompt_length` / `response_length`
    (defaults: the batch's longest prompt / response). Longer parts raise `ConversionError`, or
    with `overflow="truncate"` lose their oldest prompt tokens or their response tail, like verl.
    """
    require_samples(samples)
    require_one_view(samples)
    split = pad_split_batch(
        samples,
        pad_id=pad_id,
        prompt_width=prompt_length,
        response_width=response_length,
        overflow=overflow,
    )
    rm_scores = None
    rewards = [reward_of(s) for s in samples]
    if all(r is not None for r in rewards):
        rm_scores = np.zeros((len(samples), split.response_width), dtype=np.float32)
        last = split.response_lengths - 1
        rm_scores[np.arange(len(samples)), last] = [r or 0.0 for r in rewards]
    return VerlBatch(
        split=split,
        rm_scores=rm_scores,
        uid=np.array([group_key(s) for s in samples], dtype=object),
        num_turns=np.array([len(s.spans) for s in samples], dtype=np.int32),
        episode_ids=np.array([s.episode_id for s in samples], dtype=object),
        trajectory_ids=np.array([trajectory_of(s) for s in samples], dtype=object),
        segment_indices=np.array(
            [-1 if s.segment_index is None else s.segment_index for s in samples], dtype=np.int32
        ),
    )


def to_agent_loop_outputs(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """One `AgentLoopOutput`-shaped dict per sample, for a custom verl `AgentLoopBase.run` to return
    as `AgentLoopOutput(**record)`: unpadded `prompt_ids`, `response_ids`, `response_mask`,
    `response_logprobs` (None when not captured) as Python lists, `reward_score`, `num_turns`,
    default `metrics`, and `extra_fields` with the sample's ids and GRPO group."""
    require_one_view(samples)
    records: list[dict[str, Any]] = []
    for sample in samples:
        split = split_point(sample)
        old = sample.ratio_logprobs()
        logprobs = None if old is None else old[split:].tolist()
        records.append(
            {
                "prompt_ids": sample.token_ids[:split].tolist(),
                "response_ids": sample.token_ids[split:].tolist(),
                "response_mask": sample.loss_mask[split:].tolist(),
                "response_logprobs": logprobs,
                "reward_score": reward_of(sample),
                "num_turns": len(sample.spans),
                "metrics": {},
                "extra_fields": {
                    "sample_id": sample.sample_id,
                    "episode_id": sample.episode_id,
                    "uid": group_key(sample),
                    "trajectory_id": trajectory_of(sample),
                    "segment_index": sample.segment_index,
                    "prev_sample_id": sample.prev_sample_id,
                    "rewrite": sample.rewrite,
                    "is_summary": sample.is_summary,
                },
            }
        )
    return records
