"""Arrow and Parquet part files of samples: the writers, the crash-safe Parquet journal, and the
readers that tolerate a torn tail. The schema and the conversion of samples to and from columns are
in `arrow_schema` (re-exported here: `SCHEMA`, `samples_to_batch`, `batch_to_samples`, ...).

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

from tito_agents.samples import Sample
from tito_agents.sinks._optional import missing
from tito_agents.sinks.arrow_schema import (
    SCHEMA,
    SPAN_TYPE,
    TOKEN_COLUMNS,
    batch_to_samples,
    parquet_options,
    samples_to_batch,
)

try:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.ipc as pa_ipc  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised only without pyarrow
    raise missing("pyarrow") from exc

__all__ = [
    "ROW_GROUP_BYTES",
    "SCHEMA",
    "SPAN_TYPE",
    "TOKEN_COLUMNS",
    "ArrowStreamWriter",
    "JournaledParquetWriter",
    "batch_to_samples",
    "convert_stream_to_parquet",
    "iter_parquet_samples",
    "iter_stream_samples",
    "parquet_options",
    "read_table",
    "repair_stream",
    "samples_to_batch",
]


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
