"""Stable 64-bit hashing for the fake vLLM: the same inputs give the same outputs in every process.

Python's `hash()` is salted per process, so every deterministic choice of the fake (which answer,
which token drifts, what logprob a token gets) goes through these functions instead.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

__all__ = ["float32", "fold", "mix", "text_key", "unit_interval"]

_MASK = (1 << 64) - 1


def mix(state: int, value: int) -> int:
    """Combine a 64-bit state with an integer (splitmix64 finaliser over `state ^ value * phi`)."""
    z = (state ^ ((value * 0x9E3779B97F4A7C15) & _MASK)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def fold(values: Iterable[int], state: int = 0) -> int:
    """Hash a sequence by mixing its items into `state` one after another."""
    for value in values:
        state = mix(state, value)
    return state


def unit_interval(state: int) -> float:
    """Map a 64-bit hash to [0, 1)."""
    return (state >> 11) / float(1 << 53)


def text_key(text: str) -> int:
    """A stable integer for a string."""
    data = text.encode("utf-8", "surrogatepass")
    return mix(zlib.crc32(data), len(data)) ^ zlib.adler32(data)


def float32(value: float) -> float:
    """Round to float32, as vLLM's logprobs are: their JSON then looks like real engine output."""
    return float(struct.unpack("<f", struct.pack("<f", value))[0])
