"""Rotating sample files (JSON Lines, Arrow IPC, Parquet) with atomic finalize and crash recovery.

`RotatingFileSink("out/samples.parquet")` writes parts ``out/samples-<run>-<index>.parquet``. A part
is written under a hidden in-progress name (``.samples-…parquet.inprogress.arrows``) and becomes
visible only when finished: it is closed, fsynced and renamed in one step, so a reader that lists
``samples-*.parquet`` never sees half a file. Rotation by sample count, size or age.

Crashes: a write that fails (disk full) is cut back to the last complete batch, so files never hold
half a sample. Every in-progress file holds whole batches (Arrow stream or JSON Lines) and is
locked by its writer; the next sink opened on the same path (or `recover_parts`) finalizes the
in-progress files of dead writers. So after a crash every sample whose `write` returned is readable.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import lifecycle
from tito_agents.sinks.base import Sink
from tito_agents.sinks.jsonl import encode_sample
from tito_agents.sinks.parts import (
    JOURNAL,
    conversion_path,
    final_name,
    finalize_journal,
    fsync_file,
    fsync_folder,
    list_parts,
    read_file_table,
    recover_parts,
)

__all__ = [
    "FileFormat",
    "FileSinkStats",
    "RotatingFileSink",
    "format_for",
    "list_parts",
    "read_file_table",
    "recover_parts",
]

logger = logging.getLogger("tito_agents.sinks")

FileFormat = Literal["jsonl", "arrow", "parquet"]
_SUFFIXES: dict[str, FileFormat] = {
    ".jsonl": "jsonl",
    ".arrow": "arrow",
    ".arrows": "arrow",
    ".parquet": "parquet",
}
_DEFAULT_SUFFIX: dict[FileFormat, str] = {
    "jsonl": ".jsonl",
    "arrow": ".arrow",
    "parquet": ".parquet",
}


def format_for(path: str | os.PathLike[str]) -> FileFormat | None:
    """The file format a path's suffix names, or None."""
    return _SUFFIXES.get(Path(path).suffix.lower())


# ---- part writers ----


class PartWriter(Protocol):
    """Writes one in-progress part. `good_size`: bytes of complete batches written so far."""

    good_size: int

    def write(self, samples: Sequence[Sample]) -> int: ...

    def fileno(self) -> int: ...

    def close(self) -> None: ...

    def abandon(self) -> None: ...

    @property
    def finished_parquet(self) -> Path | None:
        """A complete Parquet file built beside the journal, if any (else the journal is final,
        or is converted)."""
        ...


class JsonlPartWriter:
    """One JSON line per sample, each batch written with one unbuffered `write` call."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.good_size = 0

    def write(self, samples: Sequence[Sample]) -> int:
        data = memoryview(b"".join(encode_sample(s) for s in samples))
        while data:
            data = data[os.write(self._fd, data) :]
        self.good_size = os.fstat(self._fd).st_size
        return self.good_size

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        os.close(self._fd)

    def abandon(self) -> None:
        os.close(self._fd)

    @property
    def finished_parquet(self) -> Path | None:
        return None


@dataclass(slots=True)
class _Part:
    journal: Path
    final: Path
    writer: PartWriter
    lock_fd: int
    opened_at: float
    samples: int = 0


@dataclass(slots=True)
class FileSinkStats:
    samples_written: int = 0
    parts_finalized: int = 0
    write_failures: int = 0
    recovered_parts: int = 0
    recovered_samples: int = 0
    unfinalized_parts: int = 0
    """In-progress parts that could not be finalized yet (readable; retried, or recovered later)."""


class RotatingFileSink(Sink):
    """Writes samples to rotating part files next to `path` (see the module docstring).

    path: ``dir/name.parquet`` (parts ``dir/name-<run>-<index>.parquet``) or a folder (parts
        ``samples-…`` in it; give `format`).
    format: "parquet", "arrow" or "jsonl"; inferred from the suffix.
    max_file_samples / max_file_bytes / max_file_seconds: rotate when any is reached (bytes are
        in-progress bytes: uncompressed Arrow for Parquet parts).
    compression: Parquet codec (default "zstd"), or Arrow IPC body compression (default none, so
        readers can memory-map without a copy).
    fsync: also fsync the in-progress file on every `flush` (finalized parts are always fsynced).
    recover: on start, finalize in-progress parts of writers that died (lock free).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        format: FileFormat | None = None,
        max_file_samples: int | None = None,
        max_file_bytes: int | None = 256 * 1024 * 1024,
        max_file_seconds: float | None = None,
        compression: str | None = "default",
        row_group_size: int = 1024,
        fsync: bool = False,
        recover: bool = True,
    ) -> None:
        self.folder, self.stem, self.suffix, self.format = _resolve(path, format)
        if compression == "default":
            compression = "zstd" if self.format == "parquet" else None
        self.compression = compression
        self.row_group_size = row_group_size
        self.max_file_samples = max_file_samples
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self.fsync = fsync
        self.run = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
        self.stats = FileSinkStats()
        self._lock = threading.Lock()
        self._part: _Part | None = None
        self._next_index = 0
        self._unfinalized: list[_Part] = []
        self._closed = False
        if self.format != "jsonl":
            from tito_agents.sinks import columnar  # noqa: F401 - fail early without pyarrow
        if recover:
            parts, samples = recover_parts(self.folder, stem=self.stem, suffix=self.suffix)
            self.stats.recovered_parts, self.stats.recovered_samples = parts, samples
        lifecycle.track(self)

    def __repr__(self) -> str:
        return f"RotatingFileSink({str(self.folder / (self.stem + self.suffix))!r})"

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- writing ----

    def write(self, samples: Sequence[Sample]) -> None:
        """Append samples to the current part (one batch); rotate when a limit is reached.

        Raises `SinkError(retryable=True)` when the disk refuses (full): the part is cut back to
        its last complete batch and finalized, and the next write starts a new part.
        """
        if not samples:
            return
        with self._lock:
            if self._closed:
                raise SinkError(f"{self!r} is closed", retryable=False)
            part = self._part or self._open_part()
            try:
                size = part.writer.write(samples)
            except OSError as exc:
                self.stats.write_failures += 1
                self._fail_part(part)
                raise SinkError(
                    f"cannot write {part.journal}: {exc}", retryable=_retryable_os_error(exc)
                ) from exc
            part.samples += len(samples)
            self.stats.samples_written += len(samples)
            if self._due(part, size):
                self._finish_current()

    def _due(self, part: _Part, size: int) -> bool:
        return (
            (self.max_file_samples is not None and part.samples >= self.max_file_samples)
            or (self.max_file_bytes is not None and size >= self.max_file_bytes)
            or (
                self.max_file_seconds is not None
                and time.monotonic() - part.opened_at >= self.max_file_seconds
            )
        )

    def _open_part(self) -> _Part:
        name = f"{self.stem}-{self.run}-{self._next_index:06d}{self.suffix}"
        self._next_index += 1
        final = self.folder / name
        journal = self.folder / f".{name}{JOURNAL}.{self._journal_kind()}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            writer = self._new_writer(journal)
            lock_fd = os.open(journal, os.O_RDONLY)
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            msg = f"cannot open {journal}: {exc}"
            raise SinkError(msg, retryable=_retryable_os_error(exc)) from exc
        self._part = _Part(journal, final, writer, lock_fd, time.monotonic())
        return self._part

    def _journal_kind(self) -> str:
        return "jsonl" if self.format == "jsonl" else "arrows"

    def _new_writer(self, journal: Path) -> PartWriter:
        if self.format == "jsonl":
            return JsonlPartWriter(journal)
        from tito_agents.sinks import columnar

        if self.format == "parquet":
            shadow = conversion_path(final_name(journal))
            return columnar.JournaledParquetWriter(
                journal, shadow, self.compression, self.row_group_size
            )
        return columnar.ArrowStreamWriter(journal, self.compression)

    def _fail_part(self, part: _Part) -> None:
        """After a failed write: cut the part back to whole batches and set it aside."""
        part.writer.abandon()
        try:
            os.truncate(part.journal, part.writer.good_size)
        except OSError as exc:
            logger.error("cannot cut back %s after a failed write: %s", part.journal, exc)
        self._part = None
        if part.samples == 0:
            _discard(part)
            return
        self._unfinalized.append(part)
        self._retry_unfinalized()

    def _finish_current(self) -> None:
        part, self._part = self._part, None
        if part is None:
            return
        try:
            part.writer.close()
        except OSError as exc:  # e.g. no room for the end-of-stream marker: the data is whole
            logger.warning("closing %s: %s", part.journal, exc)
            with contextlib.suppress(OSError):  # best effort: readers stop at a torn tail
                os.truncate(part.journal, part.writer.good_size)
        if part.samples == 0:
            _discard(part)
            return
        self._unfinalized.append(part)
        self._retry_unfinalized()

    def _retry_unfinalized(self) -> None:
        for part in list(self._unfinalized):
            try:
                self._finalize(part)
            except OSError as exc:
                logger.warning(
                    "cannot finalize %s yet (%s); it stays readable and will be retried",
                    part.journal,
                    exc,
                )
                break
            self._unfinalized.remove(part)
            os.close(part.lock_fd)
            self.stats.parts_finalized += 1
        self.stats.unfinalized_parts = len(self._unfinalized)

    def _finalize(self, part: _Part) -> None:
        parquet = part.writer.finished_parquet
        if parquet is not None and parquet.exists():
            fsync_file(parquet)
            os.replace(parquet, part.final)
            fsync_folder(part.final.parent)
            part.journal.unlink()
            return
        finalize_journal(
            part.journal,
            part.final,
            compression=self.compression,
            row_group_size=self.row_group_size,
        )

    # ---- flush / close ----

    def flush(self) -> None:
        """Make written samples durable in the in-progress part (fsync when `fsync=True`), rotate
        an expired part and retry finalizing parts the disk refused before."""
        with self._lock:
            part = self._part
            if part is not None:
                if self.fsync:
                    _fsync_quietly(part.lock_fd)
                if self._due(part, part.writer.good_size):
                    self._finish_current()
            if self._unfinalized:
                self._retry_unfinalized()

    def close(self) -> None:
        """Finalize the current part. Idempotent. Raises `SinkError(retryable=True)` if a part
        could not be finalized (it stays readable in-progress; the next sink on this path, or
        `recover_parts`, finalizes it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._finish_current()
            left = list(self._unfinalized)
            for part in left:
                os.close(part.lock_fd)
            self._unfinalized.clear()
        if left:
            raise SinkError(
                f"{len(left)} part(s) not finalized: {[str(p.journal) for p in left]}; they are "
                "readable and will be finalized by recover_parts or the next sink on this path",
                retryable=True,
            )

    def close_at_exit(self, timeout: float) -> str:
        try:
            self.close()
        except SinkError as exc:
            return str(exc)
        return "finalized its current part"


def _resolve(
    path: str | os.PathLike[str], format: FileFormat | None
) -> tuple[Path, str, str, FileFormat]:
    base = Path(path).expanduser()  # "~/samples.jsonl" as a shell would read it
    is_folder = str(path).endswith(os.sep) or base.is_dir()
    if is_folder:
        fmt = format or "parquet"
        return base, "samples", _DEFAULT_SUFFIX[fmt], fmt
    inferred = format_for(base)
    chosen = format or inferred
    if chosen is None:
        raise ConfigurationError(
            f"cannot tell the file format of {str(path)!r}: use a .jsonl, .arrow or .parquet "
            "suffix, or pass format="
        )
    suffix = base.suffix if inferred == chosen else _DEFAULT_SUFFIX[chosen]
    stem = base.stem if inferred is not None else base.name
    return base.parent, stem, suffix, chosen


def _retryable_os_error(exc: OSError) -> bool:
    return exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG)


def _discard(part: _Part) -> None:
    part.journal.unlink(missing_ok=True)
    conversion_path(part.final).unlink(missing_ok=True)
    os.close(part.lock_fd)


def _fsync_quietly(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        logger.warning("fsync failed: %s", exc)
