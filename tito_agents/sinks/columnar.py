"""Samples as Arrow columns: the schema, the conversion both ways, and the Arrow/Parquet part files.

One row per sample. Token arrays are typed list columns (`list<int32>` ids, `list<uint8>` mask,
`list<float32>` logprobs, null when not captured), built from the numpy arrays with one copy, never
through Python lists; spans are `list<struct>`; free-form metadata is a JSON string. Trainers,
Hugging Face `datasets`, Polars, DuckDB and Ray Data read these files directly.

Part files (see `tito_agents.sinks.files` for rotation and atomic finalize):

* Arrow: an Arrow IPC *stream*, uncompressed by default so a reader can memory-map it without a
  copy. The in-progress file is the same stream; a crash leaves every complete record batch
  readable, and finalizing is a rename.
* Parquet (zstd; dictionary encoding and statistics off for the token columns, which makes writes
  3-4x faster). A Parquet file is unreadable until its footer is written, so each batch also goes
  to an Arrow stream journal, and a crash loses no written sample (recovery converts the journal).
  The Parquet encoding runs on a helper thread beside the journal write (pyarrow releases the
  GIL), so on a machine with a spare core crash safety costs little.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tito_agents.samples import SCHEMA_VERSION, CallSpan, Sample, view_of
from tito_agents.sinks._optional import missing

try:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.ipc as pa_ipc  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised only without pyarrow
    raise missing("pyarrow") from exc

TOKEN_COLUMNS = ("token_ids", "loss_mask", "logprobs", "policy_logprobs")
"""The array columns: no dictionary encoding, no statistics (both cost much and help nothing)."""

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
    ]
)

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
    ]
)
"""The Arrow schema of sample files (Sample fields; `metadata` as a JSON string)."""

_SCALAR_COLUMNS = [n for n in SCHEMA.names if n not in TOKEN_COLUMNS]
_ADDED_COLUMNS = ("view",)
"""Scalar columns newer than the first files: read when present (`Sample.view` is otherwise
implied by `start_reason`)."""


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
            [orjson.dumps(s.metadata).decode() if s.metadata else None for s in samples],
            pa.string(),
        ),
        _list_column([s.policy_logprobs for s in samples], np.float32, pa.float32()),
        pa.array([s.view for s in samples], pa.string()),
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
        )
        sample.validate()
        yield sample


# ---- part writers ----


class ArrowStreamWriter:
    """Appends record batches to an Arrow IPC stream file; one batch per `write` call.

    `good_size` is the file size after the last complete batch: a failed write is cut back to it,
    so the file always holds whole batches only.
    """

    def __init__(self, path: Path, compression: str | None = None) -> None:
        self.path = path
        self._file = pa.OSFile(str(path), "wb")
        options = pa_ipc.IpcWriteOptions(compression=compression)
        self._writer = pa_ipc.new_stream(self._file, SCHEMA, options=options)
        self.good_size = 0

    def write(self, samples: Sequence[Sample]) -> int:
        return self.write_batch(samples_to_batch(samples))

    def write_batch(self, batch: Any) -> int:
        self._writer.write_batch(batch)
        self.good_size = self._file.tell()
        return self.good_size

    def fileno(self) -> int:
        return int(self._file.fileno())

    def close(self) -> None:
        """End the stream (writes the end-of-stream marker) and close the file."""
        self._writer.close()
        self._file.close()

    def abandon(self) -> None:
        """Close the file without writing anything more (after a failed write)."""
        self._file.close()

    @property
    def finished_parquet(self) -> Path | None:
        return None


ROW_GROUP_BYTES = 64 * 1024 * 1024
"""A Parquet row group is cut at `row_group_size` rows or this many array bytes."""


class _RowGroups:
    """Gathers record batches into row groups of a bounded size for a `ParquetWriter`."""

    def __init__(self, out: Any, row_group_size: int) -> None:
        self._out = out
        self._row_group_size = row_group_size
        self._batches: list[Any] = []
        self._rows = 0
        self._bytes = 0

    def add(self, batch: Any) -> None:
        self._batches.append(batch)
        self._rows += batch.num_rows
        self._bytes += batch.nbytes
        if self._rows >= self._row_group_size or self._bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._batches:
            self._out.write_table(pa.Table.from_batches(self._batches))
            self._batches, self._rows, self._bytes = [], 0, 0


class JournaledParquetWriter:
    """A crash-safe Parquet part: each batch is written to an Arrow stream journal (readable after
    a crash) and, on a helper thread, into the Parquet file `shadow` beside it.

    If the Parquet side fails (e.g. disk full) the part is finalized from the journal instead.
    """

    def __init__(
        self, journal: Path, shadow: Path, compression: str | None, row_group_size: int
    ) -> None:
        self.path = journal
        self.shadow = shadow
        self._journal = ArrowStreamWriter(journal)
        self._parquet: Any = None
        self._groups: _RowGroups | None = None
        self._options = parquet_options(compression)
        self._row_group_size = row_group_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tito-parquet")
        self._pending: deque[Future[None]] = deque()
        self.failed: BaseException | None = None
        self._closed = False
        self.good_size = 0

    def write(self, samples: Sequence[Sample]) -> int:
        batch = samples_to_batch(samples)
        while len(self._pending) >= 2:  # bounded: at most two batches wait for the encoder
            self._pending.popleft().result()
        if self.failed is None:
            try:
                self._pending.append(self._executor.submit(self._encode, batch))
            except RuntimeError as exc:  # no new work at interpreter exit: use the journal
                self.failed = exc
        try:
            self.good_size = self._journal.write_batch(batch)
        except BaseException as exc:
            self.failed = exc  # the Parquet side now holds a batch the journal lacks
            raise
        return self.good_size

    def _encode(self, batch: Any) -> None:
        if self.failed is not None:
            return
        try:
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(str(self.shadow), SCHEMA, **self._options)
                self._groups = _RowGroups(self._parquet, self._row_group_size)
            assert self._groups is not None
            self._groups.add(batch)
        except BaseException as exc:  # reported through `failed`; the journal stays the truth
            self.failed = exc

    def _finish_parquet(self) -> None:
        while self._pending:
            self._pending.popleft().result()
        self._executor.shutdown(wait=True)
        if self._parquet is None:
            return
        try:
            if self.failed is None and self._groups is not None:
                self._groups.flush()
            self._parquet.close()
        except BaseException as exc:
            self.failed = self.failed or exc

    def fileno(self) -> int:
        return self._journal.fileno()

    def close(self) -> None:
        """End the journal and write the Parquet footer (the caller then finalizes)."""
        self._closed = True
        try:
            self._journal.close()
        finally:
            self._finish_parquet()

    def abandon(self) -> None:
        self.failed = self.failed or RuntimeError("abandoned after a failed write")
        self._closed = True
        self._journal.abandon()
        self._finish_parquet()

    @property
    def finished_parquet(self) -> Path | None:
        """The complete Parquet file to rename into place, or None to convert the journal."""
        if self._closed and self.failed is None and self._parquet is not None:
            return self.shadow
        return None


def convert_stream_to_parquet(
    stream_path: Path, parquet_path: Path, compression: str | None, row_group_size: int
) -> int:
    """Write the batches of an Arrow stream journal as a Parquet file; returns the row count."""
    rows = 0
    with pa.memory_map(str(stream_path), "r") as source:
        reader = _StreamBatches(source)
        with pq.ParquetWriter(str(parquet_path), SCHEMA, **parquet_options(compression)) as out:
            groups = _RowGroups(out, row_group_size)
            for batch in reader:
                groups.add(_in_schema(batch))
                rows += batch.num_rows
            groups.flush()
    return rows


def _in_schema(batch: Any) -> Any:
    """`batch` in `SCHEMA`: a journal written before a column was added gets it as nulls."""
    if batch.schema.equals(SCHEMA):
        return batch
    columns = [
        batch.column(f.name) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
        for f in SCHEMA
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


class _StreamBatches:
    """Iterates the complete batches of an Arrow stream, stopping quietly at a torn tail.

    `good_size` is the byte offset just after the last complete batch.
    """

    def __init__(self, source: Any) -> None:
        self._source = source
        self.good_size = 0

    def __iter__(self) -> Iterator[Any]:
        try:
            reader = pa_ipc.open_stream(self._source)
        except (OSError, pa.ArrowInvalid):
            return  # not even a schema: nothing complete
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                self.good_size = self._source.tell()
                return
            except (OSError, pa.ArrowInvalid):
                return
            self.good_size = self._source.tell()
            yield batch


def repair_stream(path: Path) -> int:
    """Cut a crashed Arrow stream back to its last complete batch; returns the rows kept."""
    rows = 0
    with pa.OSFile(str(path), "rb") as source:
        batches = _StreamBatches(source)
        for batch in batches:
            rows += batch.num_rows
        good = batches.good_size
    if good < os.stat(path).st_size:
        os.truncate(path, good)
    return rows


def iter_stream_samples(path: Path) -> Iterator[Sample]:
    """Samples of an Arrow stream file, tolerating a torn tail (an in-progress or crashed part)."""
    with pa.memory_map(str(path), "r") as source:
        for batch in _StreamBatches(source):
            yield from batch_to_samples(batch)


def iter_parquet_samples(path: Path, batch_size: int = 1024) -> Iterator[Sample]:
    with pq.ParquetFile(str(path)) as handle:
        for batch in handle.iter_batches(batch_size=batch_size):
            yield from batch_to_samples(batch)


def read_table(paths: Sequence[Path]) -> Any:
    """All rows of finalized part files as one `pyarrow.Table` (for columnar trainer code)."""
    tables = []
    for path in paths:
        if path.suffix == ".parquet":
            tables.append(pq.read_table(str(path)))
        else:
            with pa.memory_map(str(path), "r") as source:
                batches = list(_StreamBatches(source))
                schema = batches[0].schema if batches else SCHEMA
                tables.append(pa.Table.from_batches(batches, schema=schema))
    if not tables:
        return SCHEMA.empty_table()
    # parts written before a column was added (`view`) get it as nulls
    return pa.concat_tables(tables, promote_options="default")
