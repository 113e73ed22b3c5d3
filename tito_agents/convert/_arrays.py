"""Array primitives shared by the converters: row padding, valid masks, positions, torch hand-off.

Every converter builds its padded arrays the same way: one preallocated `[B, W]` array per field and
one slice assignment per sample (a memcpy), never a Python loop over tokens. Torch is optional: it is
imported once, on the first `to_torch` call, and a missing install raises `ConfigurationError` with
the command that fixes it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tito_agents.errors import ConfigurationError

Side = Literal["left", "right"]
Overflow = Literal["error", "truncate"]

IGNORE_INDEX = -100
"""Label of a position the loss skips (the PyTorch / Hugging Face cross-entropy convention)."""

TORCH_HINT = "pip install torch  (or use the numpy arrays, which need nothing else)"


def check_side(side: str) -> Side:
    if side not in ("left", "right"):
        raise ValueError(f"padding side must be 'left' or 'right', got {side!r}")
    return side  # type: ignore[return-value]


def check_overflow(overflow: str) -> Overflow:
    if overflow not in ("error", "truncate"):
        raise ValueError(f"overflow must be 'error' or 'truncate', got {overflow!r}")
    return overflow  # type: ignore[return-value]


_MAX_ID = 2**31 - 1


def check_pad_id(pad_id: Any) -> int:
    """`pad_id` as an int32 token id. A tokenizer without a pad token gives None
    (`tokenizer.pad_token_id`), which would otherwise fail deep inside numpy; a float or a
    negative id would silently become a wrong or out-of-vocabulary id."""
    if isinstance(pad_id, bool) or not isinstance(pad_id, int | np.integer):
        raise ValueError(
            f"pad_id must be an int token id, got {pad_id!r} (tokenizer.pad_token_id is None? "
            "pass tokenizer.eos_token_id; pads are masked out of attention and loss)"
        )
    if not 0 <= int(pad_id) <= _MAX_ID:
        raise ValueError(f"pad_id must be in [0, 2**31), got {pad_id}")
    return int(pad_id)


def check_width(name: str, width: int | None, minimum: int) -> None:
    """A fixed width given by the caller must be an int >= `minimum`: a smaller one would make
    numpy fail on a negative dimension, or leave rows with nothing in them."""
    if width is None:
        return
    if isinstance(width, bool) or not isinstance(width, int | np.integer) or width < minimum:
        raise ValueError(
            f"{name} must be an int >= {minimum} (or None for the longest), got {width!r}"
        )


def check_advantages(advantages: Any, count: int) -> npt.NDArray[np.float32]:
    """Caller-given advantages as float32, one finite value per sample (`ValueError` otherwise: a
    NaN or inf advantage would poison every gradient it touches)."""
    try:
        adv = np.asarray(advantages, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"advantages must be numbers, one per sample: {exc}") from None
    if adv.shape != (count,):
        raise ValueError(f"advantages: expected one per sample ({count}), got shape {adv.shape}")
    if not np.isfinite(adv).all():
        bad = int(np.flatnonzero(~np.isfinite(adv))[0])
        raise ValueError(f"advantages[{bad}] is {adv[bad]}: every advantage must be finite")
    return adv


def round_up(width: int, multiple: int | None) -> int:
    """`width` rounded up to a multiple of `multiple` (unchanged when None)."""
    if multiple is None:
        return width
    if multiple < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {multiple}")
    return -(-width // multiple) * multiple


def lengths_of(arrays: Sequence[npt.NDArray[Any]]) -> npt.NDArray[np.int64]:
    return np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))


def span_mask(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.uint8]:
    """`[B, width]` mask, 1 on `starts[b] <= t < ends[b]`: one broadcast compare, no loop."""
    cols = np.arange(width, dtype=np.int64)
    inside = (cols >= starts[:, None]) & (cols < ends[:, None])
    return inside.view(np.uint8)


def positions(
    starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.int32]:
    """`[B, width]` position ids of rows whose real tokens are `starts[b] : starts[b] + lengths[b]`.

    Equal to verl's `compute_position_id_with_mask`, `max(cumsum(attention_mask) - 1, 0)`, in
    closed form (`clip(t - start, 0, length - 1)`, ~8x faster than the cumsum): real tokens count
    0, 1, ...; left pads get 0 and right pads repeat the last position. Attention ignores pads.
    """
    pos = np.arange(width, dtype=np.int32)[None, :] - starts.astype(np.int32)[:, None]
    last = np.maximum(lengths - 1, 0).astype(np.int32)[:, None]
    np.clip(pos, 0, last, out=pos)
    return pos


def blank(shape: tuple[int, int], value: float, dtype: type[Any]) -> npt.NDArray[Any]:
    """A `shape` array of `value`; zeros come from `np.zeros` (lazily zeroed pages, no fill pass)."""
    if value == 0:
        return np.zeros(shape, dtype=dtype)
    return np.full(shape, value, dtype=dtype)


def fill_rows(
    out: npt.NDArray[Any],
    rows: Sequence[npt.NDArray[Any]],
    starts: npt.NDArray[np.int64],
) -> None:
    """Copy `rows[b]` into `out[b, starts[b]:]`: one slice assignment (memcpy) per row."""
    for b, (row, start) in enumerate(zip(rows, starts.tolist(), strict=True)):
        out[b, start : start + row.shape[0]] = row


def shift_left(
    values: npt.NDArray[Any], last: npt.NDArray[np.bool_], fill: float | int
) -> npt.NDArray[Any]:
    """`out[..., t] = values[..., t + 1]`, and `fill` where `last` is set or past the end.

    `last` (same shape as `values`) marks each sequence's final position, whose next token belongs
    to no sequence (the next sample in a packed row, or a pad).
    """
    out = np.empty_like(values)
    if values.shape[-1] == 0:  # a batch of empty samples: nothing to shift
        return out
    out[..., :-1] = values[..., 1:]
    out[..., -1] = fill
    out[last] = fill
    return out


@functools.cache
def _torch_or_none() -> ModuleType | None:
    """The one guarded torch import; the outcome is cached for the process."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is installed in the dev environment
        return None
    return torch


def torch_module() -> ModuleType:
    """The `torch` module; `ConfigurationError` with an install hint when it is not installed."""
    torch = _torch_or_none()
    if torch is None:  # pragma: no cover - torch is installed in the dev environment
        raise ConfigurationError(f"to_torch() needs torch, which is not installed: {TORCH_HINT}")
    return torch


def torch_available() -> bool:
    """Whether `.to_torch()` can work here (torch importable)."""
    return _torch_or_none() is not None


def to_torch(arrays: Mapping[str, npt.NDArray[Any]]) -> dict[str, Any]:
    """Each array as a torch tensor in the dtype trainers feed models: integers (ids, masks,
    positions) as int64, floats as float32, bools as bool. Contiguous arrays of those dtypes are
    shared with numpy, not copied."""
    torch = torch_module()
    out: dict[str, Any] = {}
    for name, array in arrays.items():
        if array.dtype == np.bool_:
            converted = array
        elif np.issubdtype(array.dtype, np.integer):
            converted = array.astype(np.int64, copy=False)
        elif np.issubdtype(array.dtype, np.floating):
            converted = array.astype(np.float32, copy=False)
        else:
            raise TypeError(f"{name}: cannot turn a {array.dtype} array into a tensor")
        out[name] = torch.from_numpy(np.ascontiguousarray(converted))
    return out
