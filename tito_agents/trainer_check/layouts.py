"""Each converter layout fed to the trainer-side model the way its trainer feeds it, shifted where
that trainer shifts, and read back per sample in trained-token order.

* `pad_right`: `pad_batch(padding_side="right")`, scored on `.shifted()` labels (OpenRLHF,
  NeMo RL, AReaL);
* `pad_left`: `pad_batch(padding_side="left")`, `.shifted()` labels, the batch's position ids;
* `pack`: `pack_batch`, one row, positions restarting per sequence, block-causal attention (what
  `cu_seqlens` does in flash-attn), `.shifted()` labels;
* `verl`: `to_verl_batch`, as verl's actor: `logits[:, -R-1:-1]` scored on `responses`, masked by
  `response_mask`;
* `trl`: `to_trl_rollout`, as TRL's GRPOTrainer: prompts left-, completions right-padded, no
  position ids, the last `C + 1` logits but one, loss on `completion_mask * env_mask`.

Every layout yields, for each sample, three aligned arrays over its trained tokens in order: the
trainer's logprob, the rollout logprob the layout carries, and the target id the trainer trains on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert import (
    IGNORE_INDEX,
    ConversionError,
    pack_batch,
    pad_batch,
    to_trl_rollout,
    to_verl_batch,
)
from tito_agents.samples import Sample
from tito_agents.trainer_check.model import block_causal_mask, next_token_logprobs

LAYOUTS = ("pad_right", "pad_left", "pack", "verl", "trl")

FloatArray = npt.NDArray[np.float64]
IdArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TokenScores:
    """One sample's trained tokens as one layout presents them to the trainer."""

    trainer: FloatArray
    """The trainer-side model's logprob of each trained token."""
    rollout: FloatArray
    """The rollout logprob the layout carries for it."""
    ids: IdArray
    """The id the trainer trains on (its label / target)."""


def _rows(
    lp: FloatArray, targets: npt.NDArray[Any], rollout: npt.NDArray[Any], keep: npt.NDArray[Any]
) -> list[TokenScores]:
    """Per row: the entries where `keep` is set, in column order."""
    out = []
    for b in range(keep.shape[0]):
        cols = np.flatnonzero(keep[b])
        out.append(
            TokenScores(
                trainer=lp[b, cols].astype(np.float64),
                rollout=np.asarray(rollout[b, cols], dtype=np.float64),
                ids=np.asarray(targets[b, cols], dtype=np.int64),
            )
        )
    return out


def _require_logprobs(arr: npt.NDArray[Any] | None) -> npt.NDArray[Any]:
    if arr is None:
        raise ConversionError("the trainer check needs rollout logprobs on every sample")
    return arr


def score_pad(model: Any, samples: Sequence[Sample], pad_id: int, side: str) -> list[TokenScores]:
    batch = pad_batch(samples, padding_side=side, pad_id=pad_id)  # type: ignore[arg-type]
    targets = batch.shifted()
    lp = next_token_logprobs(
        model,
        batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    )
    keep = targets.labels != IGNORE_INDEX
    return _rows(lp, targets.labels, _require_logprobs(targets.logprobs), keep)


def score_pack(model: Any, samples: Sequence[Sample], pad_id: int) -> list[TokenScores]:
    del pad_id  # a packed row has no pads
    batch = pack_batch(samples)
    targets = batch.shifted()
    lp = next_token_logprobs(
        model,
        batch.input_ids[None],
        attention_mask=block_causal_mask(batch.sequence_ids),
        position_ids=batch.position_ids[None],
    )[0]
    rollout = _require_logprobs(targets.logprobs)
    out = []
    for b in range(len(samples)):
        lo, hi = int(batch.cu_seqlens[b]), int(batch.cu_seqlens[b + 1])
        cols = lo + np.flatnonzero(targets.labels[lo:hi] != IGNORE_INDEX)
        out.append(
            TokenScores(
                trainer=lp[cols],
                rollout=rollout[cols].astype(np.float64),
                ids=targets.labels[cols].astype(np.int64),
            )
        )
    return out


def score_verl(model: Any, samples: Sequence[Sample], pad_id: int) -> list[TokenScores]:
    """verl's `dp_actor._forward_micro_batch`: logits of the whole `[P + R]` input, the last `R + 1`
    positions but one scored against `responses`, masked by `response_mask`."""
    batch = to_verl_batch(samples, pad_id=pad_id)
    width = int(batch.responses.shape[1])
    lp_full = next_token_logprobs(
        model,
        batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.split.position_ids,
    )
    lp = lp_full[:, -width - 1 : -1]
    rollout = _require_logprobs(batch.split.response_logprobs)
    return _rows(lp, batch.responses, rollout, batch.response_mask.astype(bool))


def score_trl(model: Any, samples: Sequence[Sample], pad_id: int) -> list[TokenScores]:
    """TRL's GRPOTrainer on a `rollout_func` result: prompts left-padded, completions right-padded,
    `input_ids = cat(prompt, completion)`, attention mask only (the model counts positions itself),
    completion logprobs from the last `C + 1` logits but one, loss on `completion_mask * env_mask`."""
    rollout = to_trl_rollout(samples, reward_key=None)
    n = len(samples)
    p_width = max(len(p) for p in rollout["prompt_ids"])
    c_width = max(len(c) for c in rollout["completion_ids"])
    ids = np.full((n, p_width + c_width), pad_id, dtype=np.int64)
    attention = np.zeros_like(ids)
    completion = np.zeros((n, c_width), dtype=np.int64)
    old = np.zeros((n, c_width), dtype=np.float64)
    loss = np.zeros((n, c_width), dtype=bool)
    for b in range(n):
        prompt, comp = rollout["prompt_ids"][b], rollout["completion_ids"][b]
        ids[b, p_width - len(prompt) : p_width] = prompt
        ids[b, p_width : p_width + len(comp)] = comp
        attention[b, p_width - len(prompt) : p_width + len(comp)] = 1
        completion[b, : len(comp)] = comp
        old[b, : len(comp)] = _require_logprobs(np.asarray(rollout["logprobs"][b], np.float64))
        loss[b, : len(comp)] = np.asarray(rollout["env_mask"][b], dtype=bool)
    lp = next_token_logprobs(model, ids, attention_mask=attention)[:, -c_width - 1 : -1]
    return _rows(lp, completion, old, loss)


_SCORERS: dict[str, Callable[[Any, Sequence[Sample], int], list[TokenScores]]] = {
    "pad_right": lambda m, s, p: score_pad(m, s, p, "right"),
    "pad_left": lambda m, s, p: score_pad(m, s, p, "left"),
    "pack": score_pack,
    "verl": score_verl,
    "trl": score_trl,
}


def score_layout(
    layout: str, model: Any, samples: Sequence[Sample], pad_id: int = 0
) -> list[TokenScores]:
    """`samples` laid out as `layout` and scored by `model`; one `TokenScores` per sample."""
    try:
        scorer = _SCORERS[layout]
    except KeyError:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}") from None
    return scorer(model, samples, pad_id)
