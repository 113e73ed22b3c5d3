"""The default sink: one sample per line of a local JSON Lines file, written with orjson.

What a reader can rely on:

* **Whole lines or nothing.** Each batch is encoded whole and written with unbuffered `os.write`
  calls under an exclusive `flock` (several processes may append to one file). A write the disk
  refuses part-way (full disk, file-size limit) is cut back to where the batch began before
  `SinkError(retryable=True)` is raised, so a retried batch never duplicates or glues lines.
* **In the OS when `write` returns.** Nothing waits in a user-space buffer: a process killed right
  after `write` returned (SIGKILL, OOM) loses none of that batch. `fsync=True` also makes each
  `flush` durable across power loss.
* **A crash's torn tail is repaired on open.** A writer killed mid-`write` can leave half a line;
  the next `JsonlSink` on the file cuts it off before appending (counted in `torn_bytes_cut` and
  logged), so the torn bytes never become corruption in the middle of the file. A complete last
  line that only lacks its newline gets the newline instead.

`iter_jsonl_samples` (what `tito_agents.read_samples` reads a JSON Lines file with) skips a torn
last line and refuses corruption anywhere else.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import orjson

from tito_agents._values import json_bytes
from tito_agents.errors import SampleFormatError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.base import Sink

logger = logging.getLogger("tito_agents.sinks")

_TAIL_CHUNK = 1 << 16
_NOT_RETRYABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.EISDIR)


def encode_sample(sample: Sample) -> bytes:
    """One sample as one JSON line (with its newline)."""
    return json_bytes(sample.to_dict(), orjson.OPT_APPEND_NEWLINE)


class JsonlSink(Sink):
    """Appends samples to `path` (created with its parent folders); see the module docstring for
    what is guaranteed when `write` returns, after a crash and on reopening.

    fsync: `flush` and `close` also fsync the file (durable across power loss, at a cost).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path).expanduser()
        self._fsync = fsync
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._needs_repair = False
        self.samples_written = 0
        self.write_failures = 0
        """Writes the disk refused (each was cut back to whole lines and raised)."""
        self.torn_bytes_cut = 0
        """Bytes of torn last lines (a crashed writer's, or a failed write's) cut off."""

    def _open(self) -> int:
        if self._fd is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as exc:
                raise SinkError(f"cannot open {self.path}: {exc}", retryable=False) from exc
            self._fd = fd
            self._needs_repair = True  # a crashed writer may have left a torn last line
        return self._fd

    def write(self, samples: Sequence[Sample]) -> None:
        """Append the samples as whole lines; returns once they are in the OS.

        Raises `SinkError(retryable=True)` when the disk refuses (full, file-size limit): the file
        is cut back to where this batch began, so retrying the same batch is safe.
        """
        if not samples:
            return
        data = memoryview(b"".join(encode_sample(s) for s in samples))
        with self._lock:
            fd = self._open()
            with _locked(fd):
                try:
                    if self._needs_repair:
                        self._repair(fd)
                    start = os.fstat(fd).st_size
                except OSError as exc:
                    self.write_failures += 1
                    raise _sink_error(self.path, exc) from exc
                try:
                    while data:
                        data = data[os.write(fd, data) :]
                except OSError as exc:
                    self.write_failures += 1
                    self._cut_back(fd, start)
                    raise _sink_error(self.path, exc) from exc
            self.samples_written += len(samples)

    def _cut_back(self, fd: int, size: int) -> None:
        """After a refused write: drop the part of the batch that reached the file."""
        try:
            os.ftruncate(fd, size)
        except OSError as exc:  # repaired (torn tail cut) before the next write instead
            self._needs_repair = True
            logger.error("%s: cannot cut back a failed write: %s", self.path, exc)

    def _repair(self, fd: int) -> None:
        """Cut a torn last line off (or end a complete one with its newline)."""
        size = os.fstat(fd).st_size
        self._needs_repair = False
        with open(self.path, "rb") as handle:
            tail = unterminated_tail(handle, size)
        if tail is None:
            return
        text, whole = tail
        if whole:
            os.write(fd, b"\n")
            return
        os.ftruncate(fd, size - len(text))
        self.torn_bytes_cut += len(text)
        logger.warning(
            "%s: cut off a torn last line (%d bytes, a writer died mid-write) before appending",
            self.path,
            len(text),
        )

    def flush(self) -> None:
        """Nothing is buffered in the process; with `fsync=True`, make the file durable."""
        with self._lock:
            if self._fd is not None and self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    if self._fsync:
                        os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    """An exclusive advisory lock: appends and repairs of several processes do not interleave."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _sink_error(path: Path, exc: OSError) -> SinkError:
    return SinkError(f"cannot write {path}: {exc}", retryable=exc.errno not in _NOT_RETRYABLE)


def unterminated_tail(stream: BinaryIO, size: int) -> tuple[bytes, bool] | None:
    """What follows the last newline of a file of `size` bytes, and whether it is a whole JSON
    value (a last sample that only lacks its newline) rather than a torn line; None when the file
    is empty or ends with a newline."""
    if size == 0:
        return None
    stream.seek(size - 1)
    if stream.read(1) == b"\n":
        return None
    text = last_line(stream, size)
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return text, False
    return text, True


def last_line(stream: BinaryIO, size: int) -> bytes:
    """The bytes after the last newline of a file of `size` bytes, read backwards in chunks."""
    end = size
    pieces: list[bytes] = []
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        stream.seek(start)
        chunk = stream.read(end - start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            pieces.append(chunk[cut + 1 :])
            break
        pieces.append(chunk)
        end = start
    return b"".join(reversed(pieces))


def iter_jsonl_samples(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """Yield the samples of one JSON Lines file one at a time (streamed, never loaded whole).

    Use `tito_agents.read_samples`, which takes any format and checks the file first; this is
    its JSON Lines reader.

    A torn last line (a crash mid-write) is skipped with a log warning; an invalid line anywhere
    else raises `SampleFormatError` naming the file and line.
    """
    path = Path(path).expanduser()
    with open(path, "rb") as handle:
        lineno = 0
        for line in handle:
            lineno += 1
            if not line.strip():
                continue
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                if not line.endswith(b"\n"):
                    logger.warning("%s: skipping torn last line %d", path, lineno)
                    return
                raise SampleFormatError(f"{path}:{lineno}: not JSON ({exc})") from exc
            try:
                yield Sample.from_dict(data)
            except SampleFormatError as exc:
                raise SampleFormatError(f"{path}:{lineno}: {exc}") from exc
