"""Behaviour logprobs: what a trainer divides by when the engine did not sample from softmax(logits).

An importance ratio `pi_new / pi_old` is only unbiased when `pi_old` is the distribution that drew
the token. vLLM draws from the logits after temperature and truncation (top-k, top-p, min-p),
renormalised; a trainer that scores the full softmax of its own logits is off on a quarter to two
thirds of the tokens of a truncated span. `behaviour_logprobs` (numpy) and
`behaviour_logprobs_torch` (differentiable) rebuild that distribution from trainer logits and give
the logprob of each sampled token under it. Both follow one spec, vLLM 0.32's CPU sampler (v1 model
runner), step by step, per token (`TokenSampling` lets every position carry its own parameters;
`TokenSampling.of_sample` reads them from a sample's spans, `CallSpan.sampling`; `SamplingParams`
is a record of `tito_agents.sampling`, re-exported here):

1. Inputs. `logits[t]` are the trainer's logits for the position that sampled `token_ids[t]`, in
   float32 or wider (vLLM casts to float32 first, v1/sample/sampler.py:97). Logit bias, bad words,
   allowed ids and penalties come *before* temperature in vLLM (sampler.py:394-407); a span that
   used them needs them applied to `logits` by the caller.
2. Greedy. `temperature < 1e-5` is greedy (sampler.py:19, 299-304; sampling_params.py:612-616 also
   switch truncation off): the engine drew the argmax, a point mass, so the logprob is 0 when the
   token attains the maximum of `logits[t]` (any of tied maxima: the engine broke the tie on its own
   logits) and -inf otherwise. Its gradient is 0. (vLLM's processed logprobs of a greedy batch are
   `log_softmax(logits)` instead, sampler.py:264-274: not what sampled.)
3. Temperature. `0 < T < 0.01` is raised to 0.01 (sampling_params.py:557-565); `z = logits / T`
   (sampler.py:230-239, 279).
4. min-p, after temperature and before top-k/top-p (sampler.py:285, the argmax-invariant
   processors): `probs = softmax(z)`; tokens with `probs < min_p * max(probs)` are removed, a token
   exactly at the threshold stays (v1/sample/logits_processor/builtin.py:102-116). `min_p = 0` is off.
5. top-k, on the min-p-masked logits: the k-th largest value v is found and tokens with `z < v` are
   removed, so every token tied with the k-th value stays and more than k may remain
   (ops/topk_topp_sampler.py:497-502 and, top-k alone, 517-536). `top_k <= 0` or `>= V` is off
   (v1/worker/gpu_input_batch.py:407-412).
6. top-p, on the top-k-masked logits renormalised: sorted ascending, `cumsum(softmax) <= 1 - p` is
   removed and the most probable token always stays (topk_topp_sampler.py:494, 504-511). So the kept
   set is the smallest most-probable prefix whose mass reaches p, the token that crosses p included;
   a prefix landing exactly on p keeps nothing more. `top_p = 1` is off. The comparison runs in the
   logits' dtype (float32 in vLLM), so at an exact boundary rounding decides, as it does in vLLM
   (min-p's too: numpy's and torch's softmax may differ there by an ulp). Tokens exactly tied across
   this boundary are kept in the order of a stable ascending sort (the higher token id survives);
   vLLM's CPU `torch.sort` is not stable, so there only the engine's mask can tell.
7. The logprob is `z[tok] - logsumexp(z[kept])`: the processed logprob vLLM returns under
   `--logprobs-mode processed_logprobs` (topk_topp_sampler.py:332-333), which is what it samples from.

Engine masks. When the engine returned the support it sampled from (`support`: per token an array
of token ids or None, or a boolean `[T, V]` mask), steps 4-6 are replaced by exactly that set and the
logprob is renormalised over it at the span's temperature (`T < 1e-5` counts as 1, as vLLM does for
greedy rows of a mixed batch, sampler.py:238). A sampled token outside the support, given or
computed, gets -inf and is flagged in `outside`: a trainer should drop it from the loss. Without a
mask such a token is a boundary case where the trainer's logits and the engine's disagree.

GPU builds differ at ties: with Triton, vLLM's top-k/top-p kernel keeps exactly k tokens and only as
many tied boundary tokens as the mass needs, lowest index first (ops/topk_topp_triton.py:420-437,
1204-1209). The CPU build has no Triton CPU backend (vllm/triton_utils/importing.py:36-47), so the
rules above are the ones our CPU server runs. Exact ties only arise with low-precision logits;
masks settle them everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from tito_agents.convert import _behaviour_torch
from tito_agents.samples import Sample
from tito_agents.sampling import (
    GREEDY_EPS,
    MIN_TEMPERATURE,
    TRUNCATION_FIELDS,
    SamplingParams,
)

_FIELDS = TRUNCATION_FIELDS
_NEUTRAL_ROW = SamplingParams().as_dict()

Array = TypeVar("Array")
Support = Sequence[npt.ArrayLike | None] | npt.NDArray[np.bool_]
"""The engine's sampling mask: per token the ids it could sample (None: no mask for that token),
or a boolean `[T, V]` array. vLLM's generate route returns the first form (`sampling_mask`)."""


@dataclass(frozen=True)
class TokenSampling:
    """Per-token sampling parameters, arrays of length T (a merged sample's spans may differ).

    Build it with `broadcast` (one span) or `from_spans` (consecutive spans in token order); the
    constructor takes the four arrays directly, with the same meanings as `SamplingParams`.
    """

    temperature: npt.NDArray[np.float64]
    top_p: npt.NDArray[np.float64]
    top_k: npt.NDArray[np.int64]
    min_p: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        arrays = {name: np.asarray(getattr(self, name)) for name in _FIELDS}
        lengths = {a.shape for a in arrays.values()}
        if len(lengths) != 1 or len(arrays["temperature"].shape) != 1:
            raise ValueError(f"TokenSampling fields must be 1-d of one length, got {lengths}")
        for name, array in arrays.items():
            dtype = np.int64 if name == "top_k" else np.float64
            object.__setattr__(self, name, array.astype(dtype, copy=False))
        t = self.temperature
        if not (np.isfinite(t).all() and (t >= 0).all()):
            raise ValueError("temperature must be finite and >= 0")
        if not ((self.top_p > 0) & (self.top_p <= 1)).all():
            raise ValueError("top_p must be in (0, 1]")
        if not ((self.min_p >= 0) & (self.min_p <= 1)).all() or (self.top_k < -1).any():
            raise ValueError("min_p must be in [0, 1] and top_k >= -1")

    def __len__(self) -> int:
        return int(self.temperature.shape[0])

    @classmethod
    def broadcast(cls, params: SamplingParams, length: int) -> TokenSampling:
        return cls.from_spans([(params, length)])

    @classmethod
    def from_spans(cls, spans: Sequence[tuple[SamplingParams, int]]) -> TokenSampling:
        """Consecutive spans, each `(params, number of its sampled tokens)`, in token order."""
        counts = [n for _, n in spans]
        if any(n < 0 for n in counts):
            raise ValueError(f"span lengths must be >= 0, got {counts}")

        def column(name: str) -> npt.NDArray[Any]:
            return np.repeat(np.array([getattr(p, name) for p, _ in spans], dtype=float), counts)

        return cls(*(column(name) for name in _FIELDS))

    @classmethod
    def of_sample(cls, sample: Sample) -> TokenSampling:
        """Per position of `sample` (unshifted, like its logprobs: position t holds how token t
        was sampled): each span's `CallSpan.sampling` on its sampled tokens, neutral values
        elsewhere and on spans that do not say (files written before spans recorded it)."""
        columns = {name: np.full(sample.num_tokens, _NEUTRAL_ROW[name]) for name in _FIELDS}
        for span in sample.spans:
            if span.sampling is None:
                continue
            for name in _FIELDS:
                columns[name][span.start : span.end] = getattr(span.sampling, name)
        return cls(**columns)

    def take(self, index: npt.ArrayLike) -> TokenSampling:
        """The rows at `index` (e.g. a sample's trained positions, `np.flatnonzero(loss_mask)`)."""
        return TokenSampling(*(getattr(self, name)[index] for name in _FIELDS))

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """The four per-token arrays by name (what a converter lays out beside the logprobs)."""
        return {name: getattr(self, name) for name in _FIELDS}


class BehaviourLogprobs(NamedTuple, Generic[Array]):
    """`logprobs[t]`: the sampled token's logprob under the distribution that sampled it (-inf when
    outside its support); `outside[t]`: the token fell outside that support (drop it from a loss).
    numpy arrays from `behaviour_logprobs`, torch tensors from `behaviour_logprobs_torch`."""

    logprobs: Array
    outside: Array

    @property
    def n_outside(self) -> int:
        return int(self.outside.sum())  # type: ignore[attr-defined]


def needs_behaviour_logprobs(samples: Sequence[Sample]) -> bool:
    """Some span of `samples` was sampled tempered or truncated: the raw softmax did not draw its
    tokens, so a trainer's ratio needs behaviour logprobs (and a batch carries the per-token
    sampling columns to compute them)."""
    return any(
        span.sampling is not None
        and (span.sampling.temperature != 1.0 or span.sampling.is_truncated)
        for sample in samples
        for span in sample.spans
    )


@dataclass(frozen=True)
class _Rows:
    """The spec's per-token parameters resolved to what the sampler runs (steps 2, 3, 5, 6)."""

    greedy: npt.NDArray[np.bool_]
    temperature: npt.NDArray[np.float64]  # effective, 1.0 on greedy rows
    top_k: npt.NDArray[np.int64]  # 0 where off
    top_p: npt.NDArray[np.float64]  # 1.0 where off
    min_p: npt.NDArray[np.float64]  # 0.0 where off


def _rows(sampling: SamplingParams | TokenSampling, length: int, vocab: int) -> _Rows:
    if isinstance(sampling, SamplingParams):
        sampling = TokenSampling.broadcast(sampling, length)
    if len(sampling) != length:
        raise ValueError(f"sampling covers {len(sampling)} tokens, logits have {length} rows")
    greedy = sampling.temperature < GREEDY_EPS
    temperature = np.where(greedy, 1.0, np.maximum(sampling.temperature, MIN_TEMPERATURE))
    top_k = np.where(greedy | (sampling.top_k <= 0) | (sampling.top_k >= vocab), 0, sampling.top_k)
    top_p = np.where(greedy, 1.0, sampling.top_p)
    min_p = np.where(greedy, 0.0, sampling.min_p)
    return _Rows(greedy, temperature, top_k, top_p, min_p)


def _check_shapes(shape: tuple[int, ...], token_ids: npt.NDArray[np.int64]) -> None:
    if len(shape) != 2 or token_ids.shape != (shape[0],):
        raise ValueError(
            f"logits must be [T, V] and token_ids [T], got {shape} and {token_ids.shape}"
        )
    if token_ids.size and (token_ids.min() < 0 or token_ids.max() >= shape[1]):
        raise ValueError(
            f"token ids must be in [0, {shape[1]}), got {token_ids.min()}..{token_ids.max()}"
        )


def _support_mask(
    support: Support | None, shape: tuple[int, int]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]] | None:
    """`(mask [T, V], has_mask [T])` from either accepted form, or None without a support."""
    if support is None:
        return None
    if isinstance(support, np.ndarray) and support.dtype == np.bool_:
        if support.shape != shape:
            raise ValueError(f"support mask must be {shape}, got {support.shape}")
        return support, np.ones(shape[0], dtype=np.bool_)
    if len(support) != shape[0]:
        raise ValueError(f"support covers {len(support)} tokens, logits have {shape[0]} rows")
    mask = np.zeros(shape, dtype=np.bool_)
    has = np.zeros(shape[0], dtype=np.bool_)
    for t, ids in enumerate(support):
        if ids is None:
            continue
        index = np.asarray(ids, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= shape[1]):
            raise ValueError(f"support of token {t} holds ids outside [0, {shape[1]})")
        mask[t, index] = True
        has[t] = True
    return mask, has


def _float_logits(logits: npt.ArrayLike) -> npt.NDArray[np.floating[Any]]:
    array = np.asarray(logits)
    if array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float64 if array.dtype.kind in "iub" else np.float32)
    return array


def behaviour_logprobs(
    logits: npt.ArrayLike,
    token_ids: npt.ArrayLike,
    sampling: SamplingParams | TokenSampling,
    *,
    support: Support | None = None,
) -> BehaviourLogprobs[npt.NDArray[Any]]:
    """Logprob of each sampled token under the distribution vLLM sampled it from (numpy).

    `logits`: `[T, V]`, row t the trainer's logits at the position that sampled `token_ids[t]`;
    `sampling`: one `SamplingParams` for all rows or a per-token `TokenSampling`; `support`: the
    engine's sampling mask, when the sample has one. Computed in the logits' float dtype (float32
    like vLLM, or float64); the module docstring is the spec. Returns logprobs and `outside` flags.
    """
    x = _float_logits(logits)
    tokens = np.asarray(token_ids, dtype=np.int64)
    _check_shapes(x.shape, tokens)
    rows = _rows(sampling, x.shape[0], x.shape[1])
    z = x / rows.temperature.astype(x.dtype)[:, None]
    keep = _truncation_keep(z, tokens, rows)
    masks = _support_mask(support, (x.shape[0], x.shape[1]))
    if masks is not None:
        keep = np.where(masks[1][:, None], masks[0], keep)
    index = np.arange(x.shape[0])
    outside = ~keep[index, tokens]
    masked = np.where(keep, z, -np.inf)
    top = np.max(masked, axis=-1, initial=-np.inf)
    safe_top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.log(np.exp(masked - safe_top[:, None]).sum(axis=-1)) + safe_top
        logprobs = np.where(outside, -np.inf, z[index, tokens] - lse).astype(x.dtype)
    return BehaviourLogprobs(logprobs, outside)


def _truncation_keep(
    z: npt.NDArray[np.floating[Any]], tokens: npt.NDArray[np.int64], rows: _Rows
) -> npt.NDArray[np.bool_]:
    """Steps 2 and 4-6 of the spec on the tempered logits `z`: the kept set, `[T, V]`."""
    keep = np.ones(z.shape, dtype=np.bool_)
    dtype = z.dtype.type
    min_rows = np.flatnonzero(rows.min_p > 0)
    if min_rows.size:
        zr = z[min_rows]
        probs = np.exp(zr - zr.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        threshold = probs.max(axis=-1, keepdims=True) * rows.min_p[min_rows, None].astype(dtype)
        keep[min_rows] = probs >= threshold
    k_rows = np.flatnonzero(rows.top_k > 0)
    if k_rows.size:
        masked = np.where(keep[k_rows], z[k_rows], -np.inf)
        ascending = np.sort(masked, axis=-1)
        column = (z.shape[1] - rows.top_k[k_rows])[:, None]
        keep[k_rows] &= masked >= np.take_along_axis(ascending, column, axis=-1)
    p_rows = np.flatnonzero(rows.top_p < 1)
    if p_rows.size:
        masked = np.where(keep[p_rows], z[p_rows], -np.inf)
        order = np.argsort(masked, axis=-1, kind="stable")
        ascending = np.take_along_axis(masked, order, axis=-1)
        probs = np.exp(ascending - ascending[:, -1:])
        probs /= probs.sum(axis=-1, keepdims=True)
        drop = np.cumsum(probs, axis=-1) <= (dtype(1) - rows.top_p[p_rows, None].astype(dtype))
        drop[:, -1] = False
        dropped = np.zeros_like(drop)
        np.put_along_axis(dropped, order, drop, axis=-1)
        keep[p_rows] &= ~dropped
    g_rows = np.flatnonzero(rows.greedy)
    if g_rows.size:
        zg = z[g_rows]
        at_max = zg[np.arange(g_rows.size), tokens[g_rows]] == zg.max(axis=-1)
        keep[g_rows] = False
        keep[g_rows[at_max], tokens[g_rows[at_max]]] = True
    return keep


def behaviour_logprobs_torch(
    logits: Any,
    token_ids: Any,
    sampling: SamplingParams | TokenSampling,
    *,
    support: Support | Any | None = None,
) -> BehaviourLogprobs[Any]:
    """`behaviour_logprobs` in torch, differentiable w.r.t. `logits` (use it in a loss).

    Same spec and arguments; `logits` is a `[T, V]` tensor (bfloat16/float16 are computed in
    float32, as vLLM does), `token_ids` a tensor or array, `support` also a boolean tensor. The
    kept set is chosen without gradient; the logprob is a log-softmax over it, so gradients reach
    the kept logits only. Tokens flagged `outside` get -inf and a zero gradient. Needs torch
    (imported on first call).
    """
    tokens = np.asarray(
        token_ids.detach().cpu().numpy() if hasattr(token_ids, "detach") else token_ids,
        dtype=np.int64,
    )
    shape = tuple(logits.shape)
    _check_shapes(shape, tokens)
    rows = _rows(sampling, shape[0], shape[1])
    masks: tuple[Any, Any] | None
    if support is not None and hasattr(support, "detach"):
        tensor: Any = support
        if tuple(tensor.shape) != shape:
            raise ValueError(f"support mask must be {shape}, got {tuple(tensor.shape)}")
        masks = (tensor, np.ones(shape[0], dtype=np.bool_))
    else:
        masks = _support_mask(support, (shape[0], shape[1]))
    logprobs, outside = _behaviour_torch.logprobs(
        logits,
        tokens,
        greedy=rows.greedy,
        temperature=rows.temperature,
        top_k=rows.top_k,
        top_p=rows.top_p,
        min_p=rows.min_p,
        masks=masks,
    )
    return BehaviourLogprobs(logprobs, outside)


__all__ = [
    "GREEDY_EPS",
    "MIN_TEMPERATURE",
    "BehaviourLogprobs",
    "SamplingParams",
    "Support",
    "TokenSampling",
    "behaviour_logprobs",
    "behaviour_logprobs_torch",
    "needs_behaviour_logprobs",
]
