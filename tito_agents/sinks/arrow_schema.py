"""Samples as Arrow columns: the schema and the conversion both ways, one row per sample.

Token arrays are typed list columns (`list<int32>` ids, `list<uint8>` mask, `list<float32>`
logprobs, null when not captured), built from the numpy arrays with one copy, never through
Python lists; spans are `list<struct>`; free-form metadata is a JSON string. Trainers, Hugging Face
`datasets`, Polars, DuckDB and Ray Data read such columns directly.

Apart from the part files (`columnar`: writers, the Parquet journal, readers of torn streams)
because this is what every columnar consumer shares (the part writers, the readers, the sink
benchmark's raw pyarrow baseline) and it changes with `Sample`, not with the file handling.
`columnar` re-exports these names, the documented place to import them from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from tito_agents._values import json_bytes
from tito_agents.samples import SCHEMA_VERSION, CallSpan, Sample, view_of
from tito_agents.sinks._optional import missing

try:
    import pyarrow as pa  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised only without pyarrow
    raise missing("pyarrow") from exc

__all__ = [
    "SAMPLING_TYPE",
    "SCHEMA",
    "SPAN_TYPE",
    "TOKEN_COLUMNS",
    "batch_to_samples",
    "parquet_options",
    "samples_to_batch",
]

TOKEN_COLUMNS = ("token_ids", "loss_mask", "logprobs", "policy_logprobs")
"""The array columns: no dictionary encoding, no statistics (both cost much and help nothing)."""

SAMPLING_TYPE = pa.struct(
    [
        ("temperature", pa.float64()),
        ("top_p", pa.float64()),
        ("top_k", pa.int32()),
        ("min_p", pa.float64()),
        ("presence_penalty", pa.float64()),
        ("frequency_penalty", pa.float64()),
        ("repetition_penalty", pa.float64()),
        ("seed", pa.int64()),
        ("min_tokens", pa.int32()),
        ("logit_bias", pa.list_(pa.struct([("token_id", pa.int32()), ("bias", pa.float64())]))),
        ("allowed_token_ids", pa.list_(pa.int32())),
        ("bad_words", pa.list_(pa.string())),
    ]
)
"""`CallSpan.sampling` (`SamplingParams.to_dict`): typed columns a query can filter on (spans
sampled with top_p < 1, ...); `logit_bias` as a list of (token_id, bias) structs (Hugging Face
`datasets` reads no Arrow map type)."""

SPAN_TYPE = pa.struct(
    [
        ("call_id", pa.string()),
        ("context_start", pa.int32()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("finish_reason", pa.string()),
        ("reward", pa.float64()),
        ("policy_version", pa.string()),
        ("constrained", pa.string()),
        ("logprob_source", pa.string()),
        ("rescore_error", pa.string()),
        ("sampling", SAMPLING_TYPE),
        ("sampling_source", pa.string()),
        ("logprobs_mode", pa.string()),
        ("role", pa.string()),
    ]
)
"""One `CallSpan`. Files written before a field existed lack it; `CallSpan.from_dict` reads
those as None."""

SCHEMA = pa.schema(
    [
        ("schema", pa.int16()),
        ("sample_id", pa.string()),
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("agent", pa.string()),
        ("model", pa.string()),
        ("reward", pa.float64()),
        ("token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("logprobs", pa.list_(pa.float32())),
        ("call_ids", pa.list_(pa.string())),
        ("spans", pa.list_(SPAN_TYPE)),
        ("start_reason", pa.string()),
        ("end_reason", pa.string()),
        ("metadata", pa.string()),
        ("policy_logprobs", pa.list_(pa.float32())),
        ("view", pa.string()),
        ("trajectory_id", pa.string()),
        ("segment_index", pa.int32()),
        ("prev_sample_id", pa.string()),
        ("rewrite", pa.string()),
        ("policy", pa.string()),
    ]
)
"""The Arrow schema of sample files (Sample fields; `metadata` as a JSON string)."""

_SCALAR_COLUMNS = [n for n in SCHEMA.names if n not in TOKEN_COLUMNS]
_ADDED_COLUMNS = (
    "view",
    "trajectory_id",
    "segment_index",
    "prev_sample_id",
    "rewrite",
    "policy",
)
"""Scalar columns newer than the first files: read when present (`Sample.view` is otherwise
implied by `start_reason`; the trajectory fields are None)."""


def parquet_options(compression: str | None = "zstd") -> dict[str, Any]:
    """The `pyarrow.parquet` writer options sample files use (also what the benchmark's raw
    pyarrow baseline uses, so the comparison is like for like)."""
    return {
        "compression": compression or "none",
        "use_dictionary": [n for n in _SCALAR_COLUMNS if n not in ("reward", "schema")],
        "write_statistics": ["sample_id", "episode_id", "task_id", "group_id", "reward"],
    }


# ---- samples -> columns ----


def _list_column(
    arrays: Sequence[np.ndarray[Any, Any] | None], dtype: type[np.generic], arrow_type: Any
) -> Any:
    """One list column from per-row numpy arrays (None = null row), with one copy of the values."""
    lengths = np.fromiter((0 if a is None else a.shape[0] for a in arrays), np.int64, len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError("more than 2**31 tokens in one batch; write smaller batches")
    present = [a for a in arrays if a is not None]
    values = np.concatenate(present).astype(dtype, copy=False) if present else np.zeros(0, dtype)
    mask = None
    if len(present) != len(arrays):
        mask = pa.array([a is None for a in arrays], type=pa.bool_())
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(values, type=arrow_type), mask=mask
    )


def samples_to_batch(samples: Sequence[Sample]) -> Any:
    """A `pyarrow.RecordBatch` of `samples` in `SCHEMA`."""
    columns = [
        pa.array(np.full(len(samples), SCHEMA_VERSION, np.int16)),
        pa.array([s.sample_id for s in samples], pa.string()),
        pa.array([s.episode_id for s in samples], pa.string()),
        pa.array([s.task_id for s in samples], pa.string()),
        pa.array([s.group_id for s in samples], pa.string()),
        pa.array([s.agent for s in samples], pa.string()),
        pa.array([s.model for s in samples], pa.string()),
        pa.array([s.reward for s in samples], pa.float64()),
        _list_column([s.token_ids for s in samples], np.int32, pa.int32()),
        _list_column([s.loss_mask for s in samples], np.uint8, pa.uint8()),
        _list_column([s.logprobs for s in samples], np.float32, pa.float32()),
        pa.array([s.call_ids for s in samples], pa.list_(pa.string())),
        pa.array([[sp.to_dict() for sp in s.spans] for s in samples], pa.list_(SPAN_TYPE)),
        pa.array([s.start_reason for s in samples], pa.string()),
        pa.array([s.end_reason for s in samples], pa.string()),
        pa.array(
            [json_bytes(s.metadata).decode() if s.metadata else None for s in samples],
            pa.string(),
        ),
        _list_column([s.policy_logprobs for s in samples], np.float32, pa.float32()),
        pa.array([s.view for s in samples], pa.string()),
        pa.array([s.trajectory_id for s in samples], pa.string()),
        pa.array([s.segment_index for s in samples], pa.int32()),
        pa.array([s.prev_sample_id for s in samples], pa.string()),
        pa.array([s.rewrite for s in samples], pa.string()),
        pa.array([s.policy for s in samples], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


# ---- columns -> samples ----


def _row_arrays(column: Any, dtype: type[np.generic]) -> list[np.ndarray[Any, Any] | None]:
    """Per-row numpy copies of a list column (None for null rows)."""
    if column.null_count == len(column):
        return [None] * len(column)
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [
        np.array(values[offsets[i] : offsets[i + 1]], dtype=dtype) if valid[i] else None
        for i in range(len(column))
    ]


def batch_to_samples(batch: Any) -> Iterator[Sample]:
    """The samples of a record batch or table in `SCHEMA` (extra columns ignored)."""
    if isinstance(batch, pa.Table):
        for chunk in batch.to_batches():
            yield from batch_to_samples(chunk)
        return
    token_ids = _row_arrays(batch.column("token_ids"), np.int32)
    loss_mask = _row_arrays(batch.column("loss_mask"), np.uint8)
    logprobs = _row_arrays(batch.column("logprobs"), np.float32)
    names = batch.schema.names
    policy = (  # files written before policy logprobs existed have no such column
        _row_arrays(batch.column("policy_logprobs"), np.float32)
        if "policy_logprobs" in names
        else [None] * batch.num_rows
    )
    absent: list[Any] = [None] * batch.num_rows
    scalars: dict[str, list[Any]] = {
        name: batch.column(name).to_pylist() if name in names else absent
        for name in _SCALAR_COLUMNS
        if name in names or name in _ADDED_COLUMNS
    }
    for i in range(batch.num_rows):
        ids = token_ids[i]
        mask = loss_mask[i]
        metadata = scalars["metadata"][i]
        sample = Sample(
            sample_id=scalars["sample_id"][i],
            episode_id=scalars["episode_id"][i],
            agent=scalars["agent"][i],
            token_ids=ids if ids is not None else np.zeros(0, np.int32),
            loss_mask=mask if mask is not None else np.zeros(0, np.uint8),
            logprobs=logprobs[i],
            reward=scalars["reward"][i],
            call_ids=list(scalars["call_ids"][i] or []),
            spans=[CallSpan.from_dict(sp) for sp in scalars["spans"][i] or []],
            task_id=scalars["task_id"][i],
            group_id=scalars["group_id"][i],
            model=scalars["model"][i],
            start_reason=scalars["start_reason"][i] or "call",
            end_reason=scalars["end_reason"][i] or "call",
            metadata=orjson.loads(metadata) if metadata else {},
            policy_logprobs=policy[i],
            view=view_of(scalars["view"][i], scalars["start_reason"][i]),
            trajectory_id=scalars["trajectory_id"][i],
            segment_index=scalars["segment_index"][i],
            prev_sample_id=scalars["prev_sample_id"][i],
            rewrite=scalars["rewrite"][i],
            policy=scalars["policy"][i],
        )
        sample.validate()
        yield sample
