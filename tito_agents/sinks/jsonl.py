"""The default sink: one sample per line of a local JSON Lines file, written with orjson.

Each batch is encoded whole and handed to one `write` call, so a crash can tear at most the last
line; `read_samples` skips a torn last line and refuses corruption anywhere else.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import orjson

from tito_agents.errors import SampleFormatError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.base import Sink

logger = logging.getLogger("tito_agents.sinks")

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def encode_sample(sample: Sample) -> bytes:
    """One sample as one JSON line (with its newline)."""
    return orjson.dumps(sample.to_dict(), option=_OPTIONS)


class JsonlSink(Sink):
    """Appends samples to `path` (created with its parent folders). `fsync=True` makes `flush`
    durable across power loss, at a cost."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self.samples_written = 0

    def _open(self) -> IO[bytes]:
        if self._file is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "ab")  # noqa: SIM115 - kept open across writes
            except OSError as exc:
                raise SinkError(f"cannot open {self.path}: {exc}", retryable=False) from exc
        return self._file

    def write(self, samples: Sequence[Sample]) -> None:
        if not samples:
            return
        data = b"".join(encode_sample(s) for s in samples)
        with self._lock:
            handle = self._open()
            try:
                handle.write(data)
            except OSError as exc:
                raise SinkError(f"cannot write {self.path}: {exc}", retryable=True) from exc
            self.samples_written += len(samples)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                if self._fsync:
                    os.fsync(self._file.fileno())
                self._file.close()
                self._file = None


def read_samples(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """Yield the samples of a JSON Lines file one at a time (the file is streamed, never loaded whole).

    A torn last line (a crash mid-write) is skipped with a log warning; an invalid line anywhere
    else raises `SampleFormatError` naming the file and line.
    """
    path = Path(path)
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
