"""Importance-ratio figures: how far the trainer's logprobs are from the rollout's, token by token.

The log ratio of a trained token is `trainer_logprob - rollout_logprob`; PPO / GRPO clip the ratio
`exp(log_ratio)` to `[1 - eps, 1 + eps]`, so a token outside that range gets no gradient whatever its
advantage. A trainer fed the exact sampled ids sees ratios of 1 up to numeric noise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

CLIP = 0.2
"""PPO's clip range (`eps`)."""


@dataclass(frozen=True, slots=True)
class RatioStats:
    """Summary of the log ratios of a set of trained tokens."""

    tokens: int
    mean_abs: float
    """Mean |log ratio| (NaN when there are no tokens)."""
    max_abs: float
    outside_clip: int
    """Tokens whose ratio lies outside `[1 - clip, 1 + clip]`."""
    clip: float = CLIP

    @property
    def outside_fraction(self) -> float:
        return self.outside_clip / self.tokens if self.tokens else 0.0

    @classmethod
    def of(cls, log_ratio: npt.NDArray[Any], clip: float = CLIP) -> RatioStats:
        values = np.asarray(log_ratio, dtype=np.float64)
        if values.size == 0:
            return cls(tokens=0, mean_abs=math.nan, max_abs=math.nan, outside_clip=0, clip=clip)
        ratio = np.exp(values)
        outside = int(np.count_nonzero((ratio < 1 - clip) | (ratio > 1 + clip)))
        magnitude = np.abs(values)
        return cls(
            tokens=int(values.size),
            mean_abs=float(magnitude.mean()),
            max_abs=float(magnitude.max()),
            outside_clip=outside,
            clip=clip,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["outside_fraction"] = self.outside_fraction
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RatioStats:
        return cls(
            tokens=int(data["tokens"]),
            mean_abs=float(data["mean_abs"]),
            max_abs=float(data["max_abs"]),
            outside_clip=int(data["outside_clip"]),
            clip=float(data.get("clip", CLIP)),
        )

    def line(self) -> str:
        """`mean |log ratio| 0.0123, max 0.31, 2 of 812 tokens (0.2%) outside clip 0.2`."""
        if not self.tokens:
            return "no tokens"
        return (
            f"mean |log ratio| {self.mean_abs:.4f}, max {self.max_abs:.3f}, "
            f"{self.outside_clip} of {self.tokens} tokens ({100 * self.outside_fraction:.1f}%) "
            f"outside clip {self.clip:g}"
        )
