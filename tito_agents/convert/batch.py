"""Padded batches: whole sequences padded left or right, or split into a left-padded prompt and a
right-padded response (the verl / TRL layout).

Pure functions over `Sample`s; numpy out, torch on request (`.to_torch()`). Each field is one
preallocated `[B, W]` array filled by one slice assignment per sample, so collating costs a memcpy
per sample and field, not Python work per token. Arrays stay unshifted (position t holds token t,
its loss bit and its rollout logprob); `.shifted()` gives the next-token layout a loss needs.

Padding conventions (verl's and TRL's, see docs/converters.md): pads carry id `pad_id`, attention 0,
loss 0 and logprob 0.0; `position_ids = max(cumsum(attention_mask) - 1, 0)` (verl's rule), so real tokens
count from 0, left pads get 0 and right pads repeat the last position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert import _sampling_arrays
from tito_agents.convert._arrays import (
    IGNORE_INDEX,
    Overflow,
    Side,
    blank,
    check_overflow,
    check_pad_id,
    check_side,
    check_width,
    fill_rows,
    positions,
    round_up,
    shift_left,
    span_mask,
    to_torch,
)
from tito_agents.convert._sample_fields import ConversionError, prompt_length, require_samples
from tito_agents.convert.behaviour import needs_behaviour_logprobs
from tito_agents.samples import Sample

IdMatrix = npt.NDArray[np.int32]
MaskMatrix = npt.NDArray[np.uint8]
FloatMatrix = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class ShiftedTargets:
    """Next-token layout: position t holds what the model is scored on at t, i.e. token t+1.

    `labels[t]` is token t+1 where that token is trained, else `IGNORE_INDEX` (-100), which also
    marks each sequence's last position; `loss_mask` and `logprobs` are shifted the same way.
    """

    labels: npt.NDArray[np.int64]
    loss_mask: MaskMatrix
    logprobs: FloatMatrix | None
    sampling: dict[str, npt.NDArray[Any]] | None = None
    """Per-token temperature, top_p, top_k, min_p of the target token, when the batch has them."""

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The shifted fields by name (`logprobs`, the sampling columns only when present),
        shaped like the batch's."""
        out: dict[str, npt.NDArray[Any]] = {"labels": self.labels, "loss_mask": self.loss_mask}
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        out.update(self.sampling or {})
        return out

    def to_torch(self) -> dict[str, Any]:
        """`arrays()` as torch tensors (int64 labels and loss mask, float32 logprobs), ready for
        `torch.nn.functional.cross_entropy(..., ignore_index=-100)`."""
        return to_torch(self.arrays())


def shifted_targets(
    input_ids: npt.NDArray[np.int32],
    loss_mask: npt.NDArray[np.uint8],
    logprobs: npt.NDArray[np.float32] | None,
    last: npt.NDArray[np.bool_],
    sampling: dict[str, npt.NDArray[Any]] | None = None,
) -> ShiftedTargets:
    """Shift ids, loss bits, logprobs (and sampling columns) one step left; `last` marks
    positions with no next token."""
    shifted_mask = shift_left(loss_mask, last, 0)
    labels = shift_left(input_ids.astype(np.int64), last, IGNORE_INDEX)
    labels[shifted_mask == 0] = IGNORE_INDEX
    shifted_lp = None if logprobs is None else shift_left(logprobs, last, 0.0)
    return ShiftedTargets(
        labels=labels,
        loss_mask=shifted_mask,
        logprobs=shifted_lp,
        sampling=_sampling_arrays.shifted(sampling, last),
    )


def _all_logprobs(samples: Sequence[Sample]) -> bool:
    """Logprob fields exist only when every sample has them (a made-up 0.0 would bias IS ratios)."""
    return all(s.ratio_logprobs() is not None for s in samples)


def _any_constrained(samples: Sequence[Sample]) -> bool:
    """`constrained_mask` fields exist only when some span was sampled under a constraint."""
    return any(span.constrained is not None for s in samples for span in s.spans)


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """Whole sequences padded to one width `T`, `[B, T]` each, on the left or the right."""

    input_ids: IdMatrix
    attention_mask: MaskMatrix
    position_ids: IdMatrix
    loss_mask: MaskMatrix
    logprobs: FloatMatrix | None
    """The old policy's logprobs for importance ratios (`Sample.ratio_logprobs`: re-scored policy
    logprobs where a constrained span was re-scored, else the rollout's), 0.0 off the trained
    tokens; None unless every sample had them."""
    lengths: npt.NDArray[np.int64]
    """Real tokens per row (after truncation)."""
    truncated: npt.NDArray[np.bool_]
    padding_side: Side
    sample_ids: tuple[str, ...]
    constrained_mask: MaskMatrix | None = None
    """1 on trained tokens sampled under a constraint (forced tool choice, structured output);
    None when no sample has such a span."""
    sampling: dict[str, npt.NDArray[Any]] | None = None
    """`temperature`, `top_p`, `top_k`, `min_p` per token (`[B, T]`, neutral off the trained
    tokens), what `behaviour_logprobs` needs; None unless some span was tempered or truncated."""

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The `[B, T]` fields by name (`logprobs`, `constrained_mask`, the sampling columns only
        when present)."""
        out: dict[str, npt.NDArray[Any]] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "loss_mask": self.loss_mask,
        }
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.constrained_mask is not None:
            out["constrained_mask"] = self.constrained_mask
        out.update(self.sampling or {})
        return out

    def to_torch(self) -> dict[str, Any]:
        """`arrays()` as torch tensors (int64 ids/masks/positions, float32 logprobs)."""
        return to_torch(self.arrays())

    def shifted(self) -> ShiftedTargets:
        """Next-token targets for a causal LM loss over this batch."""
        width = int(self.input_ids.shape[1])
        starts = (
            np.zeros_like(self.lengths) if self.padding_side == "right" else width - self.lengths
        )
        last = _no_next_token(starts, self.lengths, width)
        return shifted_targets(self.input_ids, self.loss_mask, self.logprobs, last, self.sampling)


def _no_next_token(
    starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.bool_]:
    """Positions whose next column is not the same sequence's next token: each row's last real
    token, and the pad just before a left-padded row's first token (a pad predicts nothing)."""
    last = np.zeros((starts.shape[0], width), dtype=np.bool_)
    rows = np.flatnonzero(lengths > 0)
    last[rows, (starts + lengths - 1)[rows]] = True
    padded = np.flatnonzero(starts > 0)
    last[padded, starts[padded] - 1] = True
    return last


def pad_batch(
    samples: Sequence[Sample],
    *,
    padding_side: Side = "right",
    pad_id: int = 0,
    width: int | None = None,
    pad_to_multiple_of: int | None = None,
    overflow: Overflow = "error",
) -> PaddedBatch:
    """Pad whole samples to one width (OpenRLHF / NeMo RL / AReaL style: right; HF generation: left).

    `width` defaults to the longest sample (rounded up to `pad_to_multiple_of`). A sample longer than
    `width` raises `ConversionError`, or with `overflow="truncate"` keeps its first `width` tokens
    (flagged in `truncated`: its tail's trained tokens are lost).
    """
    require_samples(samples)
    side = check_side(padding_side)
    mode = check_overflow(overflow)
    pad_id = check_pad_id(pad_id)
    check_width("width", width, 1)
    full = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=len(samples))
    width = round_up(int(full.max()) if width is None else width, pad_to_multiple_of)
    truncated = full > width
    if truncated.any() and mode == "error":
        b = int(np.flatnonzero(truncated)[0])
        raise ConversionError(
            f"sample {samples[b].sample_id}: {int(full[b])} tokens > width {width} "
            "(raise width, or pass overflow='truncate')"
        )
    lengths = np.minimum(full, width)
    starts = np.zeros_like(lengths) if side == "right" else width - lengths
    n = len(samples)
    keep = [int(k) for k in lengths]

    input_ids = blank((n, width), pad_id, np.int32)
    fill_rows(input_ids, [s.token_ids[:k] for s, k in zip(samples, keep, strict=True)], starts)
    loss_mask = np.zeros((n, width), dtype=np.uint8)
    fill_rows(loss_mask, [s.loss_mask[:k] for s, k in zip(samples, keep, strict=True)], starts)
    logprobs = None
    if _all_logprobs(samples):
        logprobs = np.zeros((n, width), dtype=np.float32)
        rows = [
            lp[:k]
            for s, k in zip(samples, keep, strict=True)
            if (lp := s.ratio_logprobs()) is not None
        ]
        fill_rows(logprobs, rows, starts)
    constrained = None
    if _any_constrained(samples):
        constrained = np.zeros((n, width), dtype=np.uint8)
        fill_rows(
            constrained,
            [s.constrained_mask()[:k] for s, k in zip(samples, keep, strict=True)],
            starts,
        )
    attention_mask = span_mask(starts, starts + lengths, width)
    return PaddedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions(starts, lengths, width),
        loss_mask=loss_mask,
        logprobs=logprobs,
        lengths=lengths,
        truncated=truncated,
        padding_side=side,
        sample_ids=tuple(s.sample_id for s in samples),
        constrained_mask=constrained,
        sampling=_sampling_arrays.padded(samples, [(0, k) for k in keep], starts, width)
        if needs_behaviour_logprobs(samples)
        else None,
    )


@dataclass(frozen=True, slots=True)
class SplitBatch:
    """Prompts left-padded to `prompt_width` columns, responses right-padded after them.

    Every prompt ends at column `prompt_width` and every response starts there. The `[B, P + R]`
    arrays are the model input; `prompt_*` and `response_*` are views of their two halves. The
    response holds everything after the prompt (sampled ids and the context between them), so its
    loss mask is verl's `response_mask` and TRL's `env_mask`.
    """

    input_ids: IdMatrix
    attention_mask: MaskMatrix
    position_ids: IdMatrix
    loss_mask: MaskMatrix
    """Loss bits over `[B, P + R]`: 0 on the whole prompt half and on pads."""
    logprobs: FloatMatrix | None
    """The old policy's logprobs over `[B, P + R]` (`Sample.ratio_logprobs`), 0.0 off the trained
    tokens; None unless every sample had them."""
    prompt_width: int
    prompt_lengths: npt.NDArray[np.int64]
    response_lengths: npt.NDArray[np.int64]
    truncated: npt.NDArray[np.bool_]
    sample_ids: tuple[str, ...]
    constrained_mask: MaskMatrix | None = None
    """Over `[B, P + R]`: 1 on trained tokens sampled under a constraint; None when none was."""
    sampling: dict[str, npt.NDArray[Any]] | None = None
    """Over `[B, P + R]`: per-token temperature, top_p, top_k, min_p (see `PaddedBatch`)."""

    @property
    def response_width(self) -> int:
        return int(self.input_ids.shape[1]) - self.prompt_width

    @property
    def prompt_ids(self) -> IdMatrix:
        return self.input_ids[:, : self.prompt_width]

    @property
    def prompt_mask(self) -> MaskMatrix:
        return self.attention_mask[:, : self.prompt_width]

    @property
    def response_ids(self) -> IdMatrix:
        return self.input_ids[:, self.prompt_width :]

    @property
    def response_attention_mask(self) -> MaskMatrix:
        return self.attention_mask[:, self.prompt_width :]

    @property
    def response_loss_mask(self) -> MaskMatrix:
        return self.loss_mask[:, self.prompt_width :]

    @property
    def response_logprobs(self) -> FloatMatrix | None:
        return None if self.logprobs is None else self.logprobs[:, self.prompt_width :]

    @property
    def response_constrained_mask(self) -> MaskMatrix | None:
        mask = self.constrained_mask
        return None if mask is None else mask[:, self.prompt_width :]

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Generic names: `prompt_ids`, `prompt_mask`, `response_ids`, `response_mask` (attention),
        `response_loss_mask`, `response_logprobs`, `input_ids`, `attention_mask`, `position_ids`."""
        out: dict[str, npt.NDArray[Any]] = {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": self.prompt_mask,
            "response_ids": self.response_ids,
            "response_mask": self.response_attention_mask,
            "response_loss_mask": self.response_loss_mask,
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }
        if self.logprobs is not None:
            out["response_logprobs"] = self.logprobs[:, self.prompt_width :]
        if self.constrained_mask is not None:
            out["response_constrained_mask"] = self.constrained_mask[:, self.prompt_width :]
        for name, values in self.response_sampling().items():
            out[f"response_{name}"] = values
        return out

    def response_sampling(self) -> dict[str, npt.NDArray[Any]]:
        """The sampling columns over the response half (`{}` when the batch has none)."""
        return {k: v[:, self.prompt_width :] for k, v in (self.sampling or {}).items()}

    def to_torch(self) -> dict[str, Any]:
        """`arrays()` as torch tensors (int64 ids/masks/positions, float32 logprobs)."""
        return to_torch(self.arrays())

    def shifted(self) -> ShiftedTargets:
        """Next-token targets over the `[B, P + R]` input (the last response token has none)."""
        starts = self.prompt_width - self.prompt_lengths
        lengths = self.prompt_lengths + self.response_lengths
        last = _no_next_token(starts, lengths, int(self.input_ids.shape[1]))
        return shifted_targets(self.input_ids, self.loss_mask, self.logprobs, last, self.sampling)


def pad_split_batch(
    samples: Sequence[Sample],
    *,
    pad_id: int = 0,
    prompt_width: int | None = None,
    response_width: int | None = None,
    overflow: Overflow = "error",
) -> SplitBatch:
    """Split each sample at its first sampled token (`prompt_length`) and pad: prompt on the left,
    response on the right.

    Widths default to the longest prompt and response of the batch. A part longer than a given
    width raises `ConversionError`, or with `overflow="truncate"` loses its oldest prompt tokens
    (the prompt keeps its end) or its response tail; such rows are flagged in `truncated`.
    """
    require_samples(samples)
    mode = check_overflow(overflow)
    pad_id = check_pad_id(pad_id)
    check_width("prompt_width", prompt_width, 0)
    check_width("response_width", response_width, 1)
    n = len(samples)
    split = np.fromiter((prompt_length(s) for s in samples), dtype=np.int64, count=n)
    total = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=n)
    response = total - split
    p_width = int(split.max()) if prompt_width is None else prompt_width
    r_width = int(response.max()) if response_width is None else response_width
    truncated = (split > p_width) | (response > r_width)
    if truncated.any() and mode == "error":
        b = int(np.flatnonzero(truncated)[0])
        raise ConversionError(
            f"sample {samples[b].sample_id}: prompt {int(split[b])} / response {int(response[b])} "
            f"tokens do not fit widths {p_width} / {r_width} (raise them, or overflow='truncate')"
        )
    p_keep = np.minimum(split, p_width)
    r_keep = np.minimum(response, r_width)
    first = split - p_keep  # first kept position of each sample
    starts = p_width - p_keep  # its column in the row
    cuts = [
        (int(a), int(b)) for a, b in zip(first.tolist(), (split + r_keep).tolist(), strict=True)
    ]
    width = p_width + r_width

    input_ids = blank((n, width), pad_id, np.int32)
    fill_rows(
        input_ids, [s.token_ids[a:b] for s, (a, b) in zip(samples, cuts, strict=True)], starts
    )
    loss_mask = np.zeros((n, width), dtype=np.uint8)
    fill_rows(
        loss_mask, [s.loss_mask[a:b] for s, (a, b) in zip(samples, cuts, strict=True)], starts
    )
    logprobs = None
    if _all_logprobs(samples):
        logprobs = np.zeros((n, width), dtype=np.float32)
        rows = [
            lp[a:b]
            for s, (a, b) in zip(samples, cuts, strict=True)
            if (lp := s.ratio_logprobs()) is not None
        ]
        fill_rows(logprobs, rows, starts)
    constrained = None
    if _any_constrained(samples):
        constrained = np.zeros((n, width), dtype=np.uint8)
        rows_c = [s.constrained_mask()[a:b] for s, (a, b) in zip(samples, cuts, strict=True)]
        fill_rows(constrained, rows_c, starts)
    attention_mask = span_mask(starts, p_width + r_keep, width)
    return SplitBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions(starts, p_keep + r_keep, width),
        loss_mask=loss_mask,
        logprobs=logprobs,
        prompt_width=p_width,
        prompt_lengths=p_keep,
        response_lengths=r_keep,
        truncated=truncated,
        sample_ids=tuple(s.sample_id for s in samples),
        constrained_mask=constrained,
        sampling=_sampling_arrays.padded(samples, cuts, starts, width)
        if needs_behaviour_logprobs(samples)
        else None,
    )
