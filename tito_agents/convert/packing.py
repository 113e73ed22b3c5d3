"""Packed batches: samples laid end to end without padding, for varlen attention.

Sequence boundaries travel two ways, as trainers expect them: `cu_seqlens` (int32 prefix sums,
flash-attn varlen / Megatron THD / verl remove-padding) and `position_ids` that restart at 0 for
every sequence (Hugging Face padding-free training derives the boundaries from the resets, as TRL's
AsyncGRPO and prime-rl do). Arrays are flat `[N]`; add a leading axis (`[None]`) for models that
want `[1, N]`. Built with one `np.concatenate` per field, no per-token Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert import _sampling_arrays
from tito_agents.convert._arrays import check_advantages, to_torch, torch_module
from tito_agents.convert._sample_fields import ConversionError, require_samples
from tito_agents.convert.batch import ShiftedTargets, shifted_targets
from tito_agents.convert.behaviour import needs_behaviour_logprobs
from tito_agents.samples import Sample


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """`B` samples as one flat row of `N` tokens."""

    input_ids: npt.NDArray[np.int32]
    position_ids: npt.NDArray[np.int32]
    """0, 1, ... within each sequence, restarting at every sequence start."""
    loss_mask: npt.NDArray[np.uint8]
    logprobs: npt.NDArray[np.float32] | None
    """The old policy's logprobs (`Sample.ratio_logprobs`), 0.0 off the trained tokens; None
    unless every sample had them."""
    cu_seqlens: npt.NDArray[np.int32]
    """`[B + 1]`: sequence b is `cu_seqlens[b]:cu_seqlens[b + 1]`."""
    max_seqlen: int
    sequence_ids: npt.NDArray[np.int32]
    """Index (0..B-1) of the sample each token comes from."""
    advantages: npt.NDArray[np.float32] | None
    """Each sample's advantage on every one of its tokens (the loss mask selects the trained
    ones); None when no advantages were given."""
    sample_ids: tuple[str, ...]
    constrained_mask: npt.NDArray[np.uint8] | None = None
    """1 on trained tokens sampled under a constraint; None when no sample has such a span."""
    sampling: dict[str, npt.NDArray[Any]] | None = None
    """`temperature`, `top_p`, `top_k`, `min_p` per token (neutral off the trained tokens), what
    `behaviour_logprobs` needs; None unless some span was tempered or truncated."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Per-token fields plus `cu_seqlens` (`logprobs` / `advantages` only when present)."""
        out: dict[str, npt.NDArray[Any]] = {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "loss_mask": self.loss_mask,
            "cu_seqlens": self.cu_seqlens,
            "sequence_ids": self.sequence_ids,
        }
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.advantages is not None:
            out["advantages"] = self.advantages
        if self.constrained_mask is not None:
            out["constrained_mask"] = self.constrained_mask
        out.update(self.sampling or {})
        return out

    def to_torch(self) -> dict[str, Any]:
        """`arrays()` as torch tensors; `cu_seqlens` stays int32, as flash-attn requires."""
        tensors = to_torch(self.arrays())
        tensors["cu_seqlens"] = torch_module().from_numpy(self.cu_seqlens)
        return tensors

    def shifted(self) -> ShiftedTargets:
        """Next-token targets; a sequence's last token never predicts the next sequence's first."""
        last = np.zeros(self.num_tokens, dtype=np.bool_)
        ends = self.cu_seqlens[1:] - 1
        last[ends[ends >= self.cu_seqlens[:-1]]] = True
        return shifted_targets(self.input_ids, self.loss_mask, self.logprobs, last, self.sampling)


def pack_batch(
    samples: Sequence[Sample], *, advantages: Sequence[float] | npt.NDArray[Any] | None = None
) -> PackedBatch:
    """Concatenate `samples` into one packed row. `advantages` (one per sample, e.g. from
    `group_advantages`) are broadcast to every token of their sample."""
    require_samples(samples)
    n = len(samples)
    lengths = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=n)
    cu_seqlens = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    total = int(cu_seqlens[-1])
    input_ids = np.concatenate([s.token_ids for s in samples]).astype(np.int32, copy=False)
    loss_mask = np.concatenate([s.loss_mask for s in samples]).astype(np.uint8, copy=False)
    logprobs = None
    ratio = [s.ratio_logprobs() for s in samples]
    if all(lp is not None for lp in ratio):
        logprobs = np.concatenate([lp for lp in ratio if lp is not None]).astype(
            np.float32, copy=False
        )
    constrained = None
    if any(span.constrained is not None for s in samples for span in s.spans):
        constrained = np.concatenate([s.constrained_mask() for s in samples])
    starts = np.repeat(cu_seqlens[:-1], lengths)
    position_ids = (np.arange(total, dtype=np.int32) - starts).astype(np.int32, copy=False)
    sequence_ids = np.repeat(np.arange(n, dtype=np.int32), lengths)
    per_token_adv = None
    if advantages is not None:
        adv = check_advantages(advantages, n)
        per_token_adv = np.repeat(adv, lengths)
    return PackedBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        cu_seqlens=cu_seqlens,
        max_seqlen=int(lengths.max()),
        sequence_ids=sequence_ids,
        advantages=per_token_adv,
        sample_ids=tuple(s.sample_id for s in samples),
        constrained_mask=constrained,
        sampling=_sampling_arrays.packed(samples) if needs_behaviour_logprobs(samples) else None,
    )


def pack_batches(
    samples: Sequence[Sample],
    token_budget: int,
    *,
    advantages: Sequence[float] | npt.NDArray[Any] | None = None,
) -> list[PackedBatch]:
    """Split `samples`, in order, into packed rows of at most `token_budget` tokens each (a new row
    starts when the next sample would overflow). A sample longer than the budget raises
    `ConversionError`: packing never cuts a sequence."""
    require_samples(samples)
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    adv = None if advantages is None else check_advantages(advantages, len(samples))
    batches: list[PackedBatch] = []
    begin, used = 0, 0
    for i, sample in enumerate(samples):
        size = sample.num_tokens
        if size > token_budget:
            raise ConversionError(
                f"sample {sample.sample_id}: {size} tokens > token_budget {token_budget}"
            )
        if used + size > token_budget:
            batches.append(pack_batch(samples[begin:i], advantages=_slice(adv, begin, i)))
            begin, used = i, 0
        used += size
    batches.append(pack_batch(samples[begin:], advantages=_slice(adv, begin, len(samples))))
    return batches


def _slice(adv: npt.NDArray[np.float32] | None, begin: int, end: int) -> npt.NDArray[Any] | None:
    return None if adv is None else adv[begin:end]
