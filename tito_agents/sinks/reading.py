"""Reading samples back: one reader for everything the file sinks write.

`read_samples(path)` takes a JSON Lines file, a Parquet or Arrow IPC file, a folder of parts, or
the path a rotating file sink was opened with (its parts ``<stem>-<run>-<index><suffix>`` are read
in write order), and returns a `SampleSource`: iterate it to stream the samples (each iteration
reads the files anew). The format is sniffed from the first bytes (magic wins), then the
extension, and the reader of that format is taken from one registry (`register_reader` replaces
one). Parquet and Arrow need pyarrow, imported the first time such a file is opened, so JSON Lines
needs no columnar library.

Everything that can be checked before a sample is read is checked when the source is opened, so a
bad file fails fast with one line naming it and the problem (`SampleFormatError`): missing file,
not a samples file (wrong magic bytes), a compressed file, pretty-printed JSON, a Parquet file
without its footer. A file a crash cut short (a torn last JSON line, an Arrow stream without its
end-of-stream marker) is read up to its last complete sample by default, with a warning for the
torn line; with `strict=True` it is refused as `TruncatedSamplesError`. Parts still being written
(hidden, in progress) are left out unless `include_in_progress=True` (`SampleSource.left_out`
names them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import orjson

from tito_agents.errors import SampleFormatError, TitoError, TruncatedSamplesError
from tito_agents.samples import Sample
from tito_agents.sinks.jsonl import iter_jsonl_samples, unterminated_tail
from tito_agents.sinks.parts import final_name, list_parts

__all__ = [
    "ARROW",
    "JSONL",
    "PARQUET",
    "SampleReader",
    "SampleSource",
    "detect_format",
    "read_samples",
    "register_reader",
]

SampleReader = Callable[[Path], Iterable[Sample]]
"""A function that streams the samples of one file of one format."""

JSONL, PARQUET, ARROW = "jsonl", "parquet", "arrow"

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

logger = logging.getLogger("tito_agents")


def _read_parquet(path: Path) -> Iterator[Sample]:
    from tito_agents.sinks.columnar import iter_parquet_samples

    yield from iter_parquet_samples(path)


def _read_arrow(path: Path) -> Iterator[Sample]:
    from tito_agents.sinks.columnar import iter_stream_samples

    yield from iter_stream_samples(path)


_READERS: dict[str, SampleReader] = {
    JSONL: iter_jsonl_samples,
    PARQUET: _read_parquet,
    ARROW: _read_arrow,  # how the Arrow sink writes: an Arrow IPC stream
}
_COLUMNAR_BUILTINS = {PARQUET: _read_parquet, ARROW: _read_arrow}


def register_reader(file_format: str, reader: SampleReader) -> None:
    """Install the reader of a format (`"jsonl"`, `"parquet"`, `"arrow"`), replacing the built-in one."""
    _READERS[file_format] = reader


@dataclass(frozen=True, slots=True)
class SampleSource:
    """An opened samples file or folder: iterate it to stream its samples (each iteration reads
    it anew).

    `estimated_samples` is a guess for JSON Lines (from the mean line length of a few probes) and
    exact for formats whose footer counts rows (`count_is_exact`); None when unknown. A folder or
    a sink's parts is one source: `parts` lists its files in read order (empty for a single file),
    `format` their formats (`"jsonl+parquet"`), `left_out` the parts still being written that are
    not read.
    """

    path: Path
    format: str
    size_bytes: int
    estimated_samples: int | None
    count_is_exact: bool
    reader: SampleReader
    parts: tuple[Path, ...] = ()
    left_out: tuple[Path, ...] = ()

    def __iter__(self) -> Iterator[Sample]:
        try:
            yield from self.reader(self.path)
        except SampleFormatError:
            raise  # names its file (a part's own) and line already
        except Exception as exc:  # OSError, and a columnar library's own (pyarrow.ArrowInvalid)
            if self.format == JSONL and not isinstance(exc, OSError):
                raise
            detail = _one_line(str(getattr(exc, "strerror", None) or exc))
            raise SampleFormatError(
                f"{self.path}: cannot read this {self.format} file: {detail}"
            ) from exc


def read_samples(
    path: str | os.PathLike[str], *, strict: bool = False, include_in_progress: bool = False
) -> SampleSource:
    """The samples a sink wrote at `path`, opened and checked; iterate the result to read them.

    `path` is what a sink was given: a file, a folder of parts, a rotating file sink's path (its
    parts are read), a `file://` URL or a path with sink options (`out/s.jsonl?max_file_samples=10`);
    `~` is expanded. `strict` refuses a file a crash cut short (`TruncatedSamplesError`) instead
    of reading it up to its last complete sample; `include_in_progress` also reads the complete
    batches of parts still being written. Raises `SampleFormatError` when `path` is not samples.
    """
    return _open(_sink_path(path), strict, include_in_progress)


def _open(path: Path, strict: bool, include_in_progress: bool) -> SampleSource:
    if not path.exists():
        return _open_sink_parts(path, strict, include_in_progress)
    if path.is_dir():
        return _open_folder(path, strict, include_in_progress)
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            file_format = detect_format(path, head)
            if file_format == JSONL:
                _check_not_pretty_json(path, handle, size)
                if strict:
                    _check_jsonl_tail(path, handle, size)
                estimate = _estimate_lines(handle, size)
                return SampleSource(path, JSONL, size, estimate, False, _READERS[JSONL])
            _check_columnar_tail(path, handle, size, file_format, head, strict)
    except OSError as exc:
        raise SampleFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    reader = _columnar_reader(path, file_format)
    rows = _parquet_rows(path) if file_format == PARQUET else None
    return SampleSource(path, file_format, size, rows, rows is not None, reader)


def _open_folder(folder: Path, strict: bool, include_in_progress: bool) -> SampleSource:
    """A folder of parts (a rotating file sink's output, or several runs' files) as one source:
    every visible file with a samples extension, in name order (a rotating sink's part names sort
    in write order). Parts in progress (hidden) are read only with `include_in_progress`;
    sub-folders (spill logs) never."""
    try:
        files = [
            p
            for p in folder.iterdir()
            if not p.name.startswith(".") and p.suffix.lower() in _EXTENSIONS and p.is_file()
        ]
    except OSError as exc:
        raise SampleFormatError(f"{folder}: cannot list: {exc.strerror or exc}") from exc
    in_progress = _in_progress(list_parts(folder, include_in_progress=True))
    if include_in_progress:
        files += in_progress
    if not files:
        known = ", ".join(sorted(set(_EXTENSIONS)))
        raise SampleFormatError(f"{folder}: is a folder with no samples files in it ({known})")
    files.sort(key=lambda p: (final_name(p) if p.name.startswith(".") else p).name)
    left_out = () if include_in_progress else tuple(in_progress)
    return _open_many(folder, files, strict, include_in_progress, left_out)


def _in_progress(parts: list[Path]) -> list[Path]:
    return [p for p in parts if p.name.startswith(".")]


def _sink_path(path: str | os.PathLike[str]) -> Path:
    """The file path of a sink spec as `Collector` and `open_sink` accept it: a `file://` URL or
    a path with sink options (`out/samples.jsonl?max_file_samples=1000`) name the same files;
    `~` is expanded, as the sinks expand it."""
    text = os.fspath(path)
    if Path(text).expanduser().exists():
        return Path(text).expanduser()
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "?" in text and not Path(text).expanduser().exists():
        text = text.split("?", 1)[0]
    return Path(text).expanduser()


def _open_sink_parts(path: Path, strict: bool, include_in_progress: bool) -> SampleSource:
    """What a rotating file sink wrote for `path` (`Collector("out/samples.parquet")` writes
    parts ``out/samples-<run>-<index>.parquet``): its finished parts in write order, as one source."""
    finished = list_parts(path)
    everything = list_parts(path, include_in_progress=True)
    if include_in_progress and everything:
        return _open_many(path, everything, strict, include_in_progress, ())
    if finished:
        left_out = tuple(_in_progress(everything))
        return _open_many(path, finished, strict, include_in_progress, left_out)
    if everything:
        raise TruncatedSamplesError(
            f"{path}: holds only parts still being written ({len(everything)} in progress: is "
            "the collector still running, or did it crash?); close the Collector, or read the "
            "complete batches of those parts"
        )
    pattern = f"{path.stem}-<run>-<index>{path.suffix}"
    raise SampleFormatError(
        f"{path}: no such file, and no parts a file sink wrote for it ({pattern})"
    )


def _open_many(
    source: Path,
    files: list[Path],
    strict: bool,
    include_in_progress: bool,
    left_out: tuple[Path, ...],
) -> SampleSource:
    """Several samples files as one source, read in the order given."""
    opened = [_open(p, strict, include_in_progress) for p in files]
    estimates = [f.estimated_samples for f in opened]
    total = None if any(e is None for e in estimates) else sum(e or 0 for e in estimates)

    def read_parts(_: Path) -> Iterator[Sample]:
        for part in opened:
            yield from part

    return SampleSource(
        source,
        "+".join(sorted({f.format for f in opened})),
        sum(f.size_bytes for f in opened),
        total,
        all(f.count_is_exact for f in opened),
        read_parts,
        tuple(files),
        left_out,
    )


def detect_format(path: Path, head: bytes) -> str:
    """The format of a file from its first bytes (magic wins), else its extension."""
    for magic, name in _COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            raise SampleFormatError(f"{path}: is {name}-compressed; decompress it first")
    if head.startswith(_PARQUET_MAGIC):
        return PARQUET
    if head.startswith(_ARROW_FILE_MAGIC) or head.startswith(_ARROW_STREAM_MAGIC):
        return ARROW
    by_extension = _EXTENSIONS.get(path.suffix.lower())
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head or stripped.startswith(b"{") or (not stripped and by_extension == JSONL):
        return JSONL
    if by_extension in (PARQUET, ARROW):
        raise SampleFormatError(f"{path}: not a {by_extension} file (its magic bytes are missing)")
    raise SampleFormatError(
        f"{path}: not a samples file (expected JSON Lines, Parquet or Arrow IPC written by a sink)"
    )


def _check_not_pretty_json(path: Path, handle: BinaryIO, size: int) -> None:
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
    raise SampleFormatError(
        f"{path}: is pretty-printed JSON (one value over several lines), not JSON Lines (one "
        f"sample per line, as the sinks write); convert it with `{fix} {path.name}`"
    )


def _check_jsonl_tail(path: Path, handle: BinaryIO, size: int) -> None:
    """Refuse a torn last line (a crash mid-write); the reader would skip it. A complete last
    sample without its newline is fine."""
    tail = unterminated_tail(handle, size)
    if tail is None or tail[1]:
        return
    raise TruncatedSamplesError(
        f"{path}: truncated: the last line is cut mid-sample ({len(tail[0]):,} bytes, no "
        "newline; a crash mid-write?)"
    )


def _estimate_lines(handle: BinaryIO, size: int) -> int | None:
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
    path: Path, handle: BinaryIO, size: int, file_format: str, head: bytes, strict: bool
) -> None:
    """Parquet and Arrow IPC files end with their magic again, Arrow streams with an end-of-stream
    marker; a missing one means the writer never finished (a crash, or an in-progress part). An
    Arrow stream is readable up to its last complete batch; a Parquet file without its footer is
    not readable at all."""
    if file_format == ARROW and head.startswith(_ARROW_STREAM_MAGIC):
        handle.seek(max(0, size - len(_ARROW_STREAM_END)))
        if handle.read(len(_ARROW_STREAM_END)) != _ARROW_STREAM_END and strict:
            raise TruncatedSamplesError(
                f"{path}: truncated Arrow stream: no end-of-stream marker (a crash mid-write, "
                "or a part still being written)"
            )
        return
    magic = _PARQUET_MAGIC if file_format == PARQUET else _ARROW_FILE_MAGIC
    handle.seek(max(0, size - len(magic)))
    if size < 2 * len(magic) or handle.read(len(magic)) != magic:
        raise SampleFormatError(f"{path}: truncated {file_format} file: its footer is missing")


def _columnar_reader(path: Path, file_format: str) -> SampleReader:
    """The registered reader of a columnar format; the built-in ones need pyarrow, checked here
    so a missing install fails when the file is opened, not part-way through reading it."""
    reader = _READERS[file_format]
    if reader is _COLUMNAR_BUILTINS.get(file_format):
        try:
            import tito_agents.sinks.columnar  # noqa: F401
        except (ImportError, TitoError) as exc:  # TitoError: the module's "install pyarrow"
            raise SampleFormatError(
                f"{path}: {file_format} samples need the columnar sinks' reader "
                f"(tito_agents.sinks.columnar): {exc}"
            ) from exc
    return reader


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
