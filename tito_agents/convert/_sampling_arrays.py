"""Per-token sampling parameters laid out like the other per-token fields of a batch.

What a trainer needs to compute behaviour logprobs (`behaviour_logprobs` with a `TokenSampling`)
on a batch: each token's temperature, top_p, top_k and min_p, from its span's `CallSpan.sampling`
(`TokenSampling.of_sample`), neutral values (1.0, 1.0, 0, 0.0) on context, padding and spans that
do not say. Present in a batch only when some span was tempered or truncated
(`behaviour.needs_behaviour_logprobs`): plain batches keep exactly the fields they had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert._arrays import fill_rows, shift_left
from tito_agents.convert.behaviour import TokenSampling
from tito_agents.samples import Sample
from tito_agents.sampling import TRUNCATION_FIELDS, SamplingParams

Columns = dict[str, npt.NDArray[Any]]

NEUTRAL = SamplingParams().as_dict()
_DTYPES = {"temperature": np.float32, "top_p": np.float32, "top_k": np.int32, "min_p": np.float32}


def _columns(sample: Sample) -> Columns:
    return TokenSampling.of_sample(sample).arrays()


def padded(
    samples: Sequence[Sample],
    cuts: Sequence[tuple[int, int]],
    starts: npt.NDArray[np.int64],
    width: int,
) -> Columns:
    """`[B, width]` columns: row b holds positions `cuts[b][0]:cuts[b][1]` of sample b from
    column `starts[b]` (the slices and columns the batch's other fields use)."""
    per_sample = [_columns(s) for s in samples]
    out: Columns = {}
    for name in TRUNCATION_FIELDS:
        matrix = np.full((len(samples), width), NEUTRAL[name], dtype=_DTYPES[name])
        rows = [c[name][a:b] for c, (a, b) in zip(per_sample, cuts, strict=True)]
        fill_rows(matrix, rows, starts)
        out[name] = matrix
    return out


def packed(samples: Sequence[Sample]) -> Columns:
    """`[N]` columns of the samples concatenated."""
    per_sample = [_columns(s) for s in samples]
    return {
        name: np.concatenate([c[name] for c in per_sample]).astype(_DTYPES[name])
        for name in TRUNCATION_FIELDS
    }


def shifted(columns: Columns | None, last: npt.NDArray[np.bool_]) -> Columns | None:
    """The columns shifted one step left, like the logprobs (neutral where no next token)."""
    if columns is None:
        return None
    return {name: shift_left(values, last, NEUTRAL[name]) for name, values in columns.items()}
