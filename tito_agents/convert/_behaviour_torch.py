"""The torch side of `tito_agents.convert.behaviour`: the same spec, differentiable w.r.t. logits.

Parameters arrive resolved (numpy arrays, one value per row, see `behaviour._rows`); torch is
imported on the first call only, so the core library never needs it. The kept set is computed under
`no_grad` on the tempered logits, then the logprob is a log-softmax over it: the support choice is
piecewise constant, the logprob inside it is smooth, so the gradient is exact where it exists.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert._arrays import torch_module


def logprobs(
    logits: Any,
    tokens: npt.NDArray[np.int64],
    *,
    greedy: npt.NDArray[np.bool_],
    temperature: npt.NDArray[np.float64],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    min_p: npt.NDArray[np.float64],
    masks: tuple[Any, npt.NDArray[np.bool_]] | None,
) -> tuple[Any, Any]:
    """`(logprobs [T], outside [T])` tensors on `logits`' device; see the behaviour module's spec."""
    torch = torch_module()
    x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    device, dtype = x.device, x.dtype
    tok = _tensor(torch, tokens).to(device)
    z = x / _tensor(torch, temperature).to(device=device, dtype=dtype)[:, None]
    with torch.no_grad():
        keep = _truncation_keep(torch, z.detach(), tok, greedy, top_k, top_p, min_p)
        if masks is not None:
            mask = masks[0]
            mask = mask if hasattr(mask, "detach") else _tensor(torch, mask)
            has = _tensor(torch, masks[1]).to(device)[:, None]
            keep = torch.where(has, mask.to(device=device, dtype=torch.bool), keep)
        outside = ~keep.gather(1, tok[:, None]).squeeze(1)
        # An outside token's row gets a one-token support so the softmax stays finite (no NaN
        # gradient); its logprob is then replaced by -inf, which passes no gradient back.
        own = torch.zeros_like(keep).scatter_(1, tok[:, None], True)
        keep = torch.where(outside[:, None], own, keep)
    lse = torch.logsumexp(z.masked_fill(~keep, float("-inf")), dim=-1)
    value = z.gather(1, tok[:, None]).squeeze(1) - lse
    return value.masked_fill(outside, float("-inf")), outside


def _tensor(torch: Any, array: npt.NDArray[Any]) -> Any:
    """A CPU tensor of `array`, shared when it is writable (torch warns on read-only arrays)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _truncation_keep(
    torch: Any,
    z: Any,
    tok: Any,
    greedy: npt.NDArray[np.bool_],
    top_k: npt.NDArray[np.int64],
    top_p: npt.NDArray[np.float64],
    min_p: npt.NDArray[np.float64],
) -> Any:
    """Steps 2 and 4-6 of the spec, `[T, V]` bool, row subsets only where a rule is on."""
    device, dtype = z.device, z.dtype
    keep = torch.ones(z.shape, dtype=torch.bool, device=device)

    def rows_where(flags: npt.NDArray[np.bool_]) -> Any:
        return _tensor(torch, np.flatnonzero(flags)).to(device)

    if (min_p > 0).any():
        rows = rows_where(min_p > 0)
        probs = torch.softmax(z[rows], dim=-1)
        threshold = (
            probs.amax(dim=-1, keepdim=True)
            * _tensor(torch, min_p).to(device=device, dtype=dtype)[rows, None]
        )
        keep[rows] = probs >= threshold
    if (top_k > 0).any():
        rows = rows_where(top_k > 0)
        masked = z[rows].masked_fill(~keep[rows], float("-inf"))
        ascending = masked.sort(dim=-1).values
        column = (z.shape[1] - _tensor(torch, top_k).to(device)[rows])[:, None]
        keep[rows] &= masked >= ascending.gather(1, column)
    if (top_p < 1).any():
        rows = rows_where(top_p < 1)
        masked = z[rows].masked_fill(~keep[rows], float("-inf"))
        ascending, order = masked.sort(dim=-1, stable=True)
        cumulative = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
        one_minus_p = 1 - _tensor(torch, top_p).to(device=device, dtype=dtype)[rows, None]
        drop = cumulative <= one_minus_p
        drop[:, -1] = False
        dropped = torch.zeros_like(drop).scatter_(1, order, drop)
        keep[rows] &= ~dropped
    if greedy.any():
        rows = rows_where(greedy)
        zg = z[rows]
        at_max = zg.gather(1, tok[rows, None]).squeeze(1) == zg.amax(dim=-1)
        own = torch.zeros_like(keep[rows]).scatter_(1, tok[rows, None], True)
        keep[rows] = own & at_max[:, None]
    return keep
