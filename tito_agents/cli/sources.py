"""Opening a samples file of any sink's format: the reader is picked by magic bytes, then extension.

JSON Lines is read with `tito_agents.read_samples` (streamed). Columnar files (Parquet, Arrow IPC)
are read with the columnar sinks' readers (`tito_agents.sinks.columnar`, needs pyarrow), imported
lazily the first time such a file is opened, so JSON Lines needs no columnar library. Extension point:
`register_reader(format, fn)` installs a reader for a format explicitly (it wins over the lazy
lookup of `READER_CANDIDATES`).

Checks done before any sample is read, so a bad file fails fast with one line naming the problem:
missing file, not a samples file (wrong magic bytes), a compressed file, a torn last line (a crash
mid-write; refused unless `allow_truncated`), a Parquet file without its footer, an Arrow stream
without its end-of-stream marker (also refused unless `allow_truncated`: the reader then keeps the
complete record batches).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tito_agents.cli._errors import CliInputError
from tito_agents.cli._paths import user_path
from tito_agents.errors import SampleFormatError, TitoError
from tito_agents.samples import Sample
from tito_agents.sinks import read_samples
from tito_agents.sinks.jsonl import unterminated_tail
from tito_agents.sinks.parts import list_parts

__all__ = [
    "READER_CANDIDATES",
    "SampleFile",
    "SampleReader",
    "detect_format",
    "open_samples",
    "register_reader",
]

SampleReader = Callable[[Path], Iterable[Sample]]
"""A function that streams the samples of a file of one format."""

JSONL, PARQUET, ARROW = "jsonl", "parquet", "arrow"

READER_CANDIDATES: dict[str, tuple[tuple[str, str], ...]] = {
    PARQUET: (("tito_agents.sinks.columnar", "iter_parquet_samples"),),
    ARROW: (("tito_agents.sinks.columnar", "iter_stream_samples"),),
}
"""(module, function) pairs tried in order to find the reader of a columnar format: the columnar
sinks' own readers (Parquet; Arrow IPC stream, which is how the Arrow sink writes)."""

_EXTENSIONS = {
    ".jsonl": JSONL,
    ".ndjson": JSONL,
    ".json": JSONL,
    ".parquet": PARQUET,
    ".pq": PARQUET,
    ".arrow": ARROW,
    ".feather": ARROW,
    ".ipc": ARROW,
    ".arrows": ARROW,
}
_PARQUET_MAGIC = b"PAR1"
_ARROW_FILE_MAGIC = b"ARROW1"
_ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
_ARROW_STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2"}
_ESTIMATE_PROBES = 4
_PROBE_BYTES = 1 << 18
_PRETTY_JSON_MAX_BYTES = 1 << 28

_registered: dict[str, SampleReader] = {}
logger = logging.getLogger("tito_agents")


def register_reader(file_format: str, reader: SampleReader) -> None:
    """Install the reader of a format (`"parquet"`, `"arrow"`, ...); it wins over the lazy lookup."""
    _registered[file_format] = reader


@dataclass(frozen=True, slots=True)
class SampleFile:
    """An opened samples file: iterate it to stream its samples (each iteration reads it anew).

    `estimated_samples` is a guess for JSON Lines (from the mean line length of a few probes) and
    exact for formats whose footer counts rows; None when unknown. A folder of parts is one source:
    `parts` lists its files in read order (empty for a single file), `format` their formats.
    """

    path: Path
    format: str
    size_bytes: int
    estimated_samples: int | None
    count_is_exact: bool
    reader: SampleReader
    parts: tuple[Path, ...] = ()

    def __iter__(self) -> Iterator[Sample]:
        try:
            yield from self.reader(self.path)
        except CliInputError:
            raise  # a part's own error, already naming the part
        except SampleFormatError as exc:
            raise CliInputError(None, _one_line(str(exc))) from exc
        except Exception as exc:  # OSError, and a columnar library's own (pyarrow.ArrowInvalid)
            if self.format == JSONL and not isinstance(exc, OSError):
                raise
            detail = _one_line(str(getattr(exc, "strerror", None) or exc))
            raise CliInputError(
                self.path, f"cannot read this {self.format} file: {detail}"
            ) from exc


def open_samples(path: str | os.PathLike[str], *, allow_truncated: bool = False) -> SampleFile:
    """Check `path` and pick its reader; `CliInputError` when it is not a usable samples file."""
    path = _sink_path(path)
    if not path.exists():
        return _open_sink_parts(path, allow_truncated)
    if path.is_dir():
        return _open_folder(path, allow_truncated)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            file_format = detect_format(path, head)
            if file_format == JSONL:
                _check_not_pretty_json(path, handle, size)
                _check_jsonl_tail(path, handle, size, allow_truncated)
                estimate = _estimate_lines(handle, size)
                return SampleFile(path, JSONL, size, estimate, False, read_samples)
            _check_columnar_tail(path, handle, size, file_format, head, allow_truncated)
    except OSError as exc:
        raise CliInputError(path, f"cannot read: {exc.strerror or exc}") from exc
    reader = _columnar_reader(path, file_format)
    rows = _parquet_rows(path) if file_format == PARQUET else None
    return SampleFile(path, file_format, size, rows, rows is not None, reader)


def _open_folder(folder: Path, allow_truncated: bool) -> SampleFile:
    """A folder of parts (a rotating file sink's output, or several runs' files) as one source:
    every visible file with a samples extension, in name order (a rotating sink's part names sort
    in write order). Hidden files (in-progress parts) and sub-folders (spill logs) are left out."""
    try:
        files = sorted(
            p
            for p in folder.iterdir()
            if not p.name.startswith(".") and p.suffix.lower() in _EXTENSIONS and p.is_file()
        )
    except OSError as exc:
        raise CliInputError(folder, f"cannot list: {exc.strerror or exc}") from exc
    if not files:
        known = ", ".join(sorted(set(_EXTENSIONS)))
        raise CliInputError(folder, f"is a folder with no samples files in it ({known})")
    return _open_many(folder, files, allow_truncated)


def _sink_path(path: str | os.PathLike[str]) -> Path:
    """The file path of a sink spec as `Collector` and `open_sink` accept it: a `file://` URL or
    a path with sink options (`out/samples.jsonl?max_file_samples=1000`) name the same files;
    `~` is expanded, as the sinks expand it."""
    text = os.fspath(path)
    if user_path(text).exists():
        return user_path(text)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "?" in text and not user_path(text).exists():
        text = text.split("?", 1)[0]
    return user_path(text)


def _open_sink_parts(path: Path, allow_truncated: bool) -> SampleFile:
    """What a rotating file sink wrote for `path` (`Collector("out/samples.parquet")` writes
    parts ``out/samples-<run>-<index>.parquet``): its finished parts in write order, as one source.
    Parts still being written (hidden, in progress) are read only with `allow_truncated`."""
    finished = list_parts(path)
    everything = list_parts(path, include_in_progress=True)
    if finished and not allow_truncated:
        if len(everything) > len(finished):
            logger.warning(
                "%s: %d part(s) still being written are left out (pass --allow-truncated to "
                "read their complete batches)",
                path,
                len(everything) - len(finished),
            )
        return _open_many(path, finished, allow_truncated)
    if everything and allow_truncated:
        return _open_many(path, everything, allow_truncated)
    if everything:
        raise CliInputError(
            path,
            f"holds only parts still being written ({len(everything)} in progress: is the "
            "collector still running, or did it crash?); close the Collector, or pass "
            "--allow-truncated to read their complete batches",
        )
    pattern = f"{path.stem}-<run>-<index>{path.suffix}"
    raise CliInputError(path, f"no such file, and no parts a file sink wrote for it ({pattern})")


def _open_many(source: Path, files: list[Path], allow_truncated: bool) -> SampleFile:
    """Several samples files as one source, read in the order given."""
    opened = [open_samples(p, allow_truncated=allow_truncated) for p in files]
    estimates = [f.estimated_samples for f in opened]
    total = None if any(e is None for e in estimates) else sum(e or 0 for e in estimates)

    def read_parts(_: Path) -> Iterator[Sample]:
        for part in opened:
            yield from part

    return SampleFile(
        source,
        "+".join(sorted({f.format for f in opened})),
        sum(f.size_bytes for f in opened),
        total,
        all(f.count_is_exact for f in opened),
        read_parts,
        tuple(files),
    )


def detect_format(path: Path, head: bytes) -> str:
    """The format of a file from its first bytes (magic wins), else its extension."""
    for magic, name in _COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            raise CliInputError(path, f"is {name}-compressed; decompress it first")
    if head.startswith(_PARQUET_MAGIC):
        return PARQUET
    if head.startswith(_ARROW_FILE_MAGIC) or head.startswith(_ARROW_STREAM_MAGIC):
        return ARROW
    by_extension = _EXTENSIONS.get(path.suffix.lower())
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head or stripped.startswith(b"{") or (not stripped and by_extension == JSONL):
        return JSONL
    if by_extension in (PARQUET, ARROW):
        raise CliInputError(path, f"not a {by_extension} file (its magic bytes are missing)")
    raise CliInputError(
        path, "not a samples file (expected JSON Lines, Parquet or Arrow IPC written by a sink)"
    )


def _check_not_pretty_json(path: Path, handle: Any, size: int) -> None:
    """Refuse a pretty-printed JSON file (one sample over several lines, e.g. `jq .`'s output) with
    what it is, rather than as a bad or torn line: JSON Lines holds one sample per line. Cheap on
    real JSON Lines: only a first line that does not parse leads to reading the whole file."""
    handle.seek(0)
    first = handle.readline(_PROBE_BYTES)
    while first.strip() == b"" and first.endswith(b"\n"):
        first = handle.readline(_PROBE_BYTES)  # blank lines, which the reader skips too
    if not first.endswith(b"\n") or size > _PRETTY_JSON_MAX_BYTES:
        return  # one line (a sample without its newline), or a first line too long to be pretty
    try:
        orjson.loads(first)
        return
    except orjson.JSONDecodeError:
        pass
    handle.seek(0)
    try:
        value = orjson.loads(handle.read(size))
    except orjson.JSONDecodeError:
        return  # not JSON as a whole either: the reader names the bad line
    fix = "jq -c '.[]'" if isinstance(value, list) else "jq -c ."
    raise CliInputError(
        path,
        "is pretty-printed JSON (one value over several lines), not JSON Lines (one sample per "
        f"line, as the sinks write); convert it with `{fix} {path.name}`",
    )


def _check_jsonl_tail(path: Path, handle: Any, size: int, allow_truncated: bool) -> None:
    """Refuse a torn last line (a crash mid-write) unless allowed; the reader would skip it. A
    complete last sample without its newline is fine."""
    tail = unterminated_tail(handle, size)
    if tail is None or tail[1] or allow_truncated:
        return
    raise CliInputError(
        path,
        f"truncated: the last line is cut mid-sample ({len(tail[0]):,} bytes, no newline; "
        "a crash mid-write?); pass --allow-truncated to skip it",
    )


def _estimate_lines(handle: Any, size: int) -> int | None:
    """About how many lines the file holds, from the newline density of a few evenly spaced probes."""
    if size == 0:
        return 0
    probed = newlines = 0
    for k in range(_ESTIMATE_PROBES):
        handle.seek(size * k // _ESTIMATE_PROBES)
        chunk = handle.read(_PROBE_BYTES)
        probed += len(chunk)
        newlines += chunk.count(b"\n")
        if probed >= size:
            break
    if newlines == 0:
        return max(1, size // max(probed, 1))
    return max(1, round(size * newlines / probed))


def _check_columnar_tail(
    path: Path, handle: Any, size: int, file_format: str, head: bytes, allow_truncated: bool
) -> None:
    """Parquet and Arrow IPC files end with their magic again, Arrow streams with an end-of-stream
    marker; a missing one means the writer never finished (a crash, or an in-progress part)."""
    if file_format == ARROW and head.startswith(_ARROW_STREAM_MAGIC):
        handle.seek(max(0, size - len(_ARROW_STREAM_END)))
        if handle.read(len(_ARROW_STREAM_END)) != _ARROW_STREAM_END and not allow_truncated:
            raise CliInputError(
                path,
                "truncated Arrow stream: no end-of-stream marker (a crash mid-write, or a part "
                "still being written); pass --allow-truncated to read its complete batches",
            )
        return
    magic = _PARQUET_MAGIC if file_format == PARQUET else _ARROW_FILE_MAGIC
    handle.seek(max(0, size - len(magic)))
    if size < 2 * len(magic) or handle.read(len(magic)) != magic:
        raise CliInputError(path, f"truncated {file_format} file: its footer is missing")


def _columnar_reader(path: Path, file_format: str) -> SampleReader:
    if file_format in _registered:
        return _registered[file_format]
    unavailable = ""
    for module_name, function_name in READER_CANDIDATES.get(file_format, ()):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        except TitoError as exc:  # the module's own "install pyarrow" error
            unavailable = str(exc)
            continue
        reader = getattr(module, function_name, None)
        if callable(reader):
            found: SampleReader = reader
            return found
    names = ", ".join(f"{m}.{f}" for m, f in READER_CANDIDATES.get(file_format, ()))
    problem = unavailable or "not found in this install"
    raise CliInputError(
        path, f"{file_format} samples need the columnar sinks' reader ({names}): {problem}"
    )


def _parquet_rows(path: Path) -> int | None:
    """The row count from the Parquet footer when pyarrow is installed (no data is read)."""
    try:
        import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except Exception:  # an unreadable footer is reported by the reader itself, with its words
        return None


def _one_line(text: str) -> str:
    return " ".join(text.split())
