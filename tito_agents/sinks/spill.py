"""The spill log: an append-only local file of samples a sink could not deliver yet.

A buffered sink spills here when its memory bound is hit, and replays the log in order once the
destination is back. Each process writes its own folder under the spill root and holds an exclusive
lock on it; a folder whose lock is free belonged to a process that died, and the next spill log
opened on the same root adopts it and replays it first. So a crash loses nothing that reached the
spill log: after the crash, the next run delivers it. Folders are made on the first spill, not
when the log is opened, and `close` removes its own folder, and the root, once they are empty: a
process that never spilled leaves nothing on disk.

Segments are replayed in name order: appended ones count up from `_FIRST_SEQ`, and `prepend` (samples
older than everything spilled so far, e.g. what waited in memory when the destination failed) counts
down from it, so a folder adopted after a crash replays in acceptance order too.

File format: segments ``<seq>.spill`` of frames ``u32 length | u32 crc32 | sample frame``
(`tito_agents.sinks.codec`). Replay progress is kept in ``<seq>.offset`` next to the segment; a crash
between delivery and that record replays a few samples twice, which readers remove by `sample_id`.
A torn last frame (a crash mid-append) is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import socket
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tito_agents.errors import SampleFormatError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.codec import decode_frame, encode_frame

logger = logging.getLogger("tito_agents.sinks")

_FRAME = struct.Struct("<II")
_LOCK = "LOCK"
_SUFFIX = ".spill"
_FIRST_SEQ = 5_000_000_000
"""Appended segments are numbered up from here, prepended ones down (10 digits either way)."""


@dataclass(slots=True)
class SpillBatch:
    """Samples read from one segment, and where reading stopped (for `SpillLog.commit`)."""

    samples: list[Sample]
    segment: Path
    end_offset: int


@dataclass(slots=True)
class _Segment:
    path: Path
    frames: int
    """Frames not yet delivered."""
    sealed: bool
    offset: int = 0


def iter_spill_file(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """Yield the samples of one spill segment (for inspection or manual replay of rejected samples).

    Stops at a torn or damaged frame with a warning.
    """
    for sample, _ in _read_frames(Path(path), 0, None):
        yield sample


def _read_frames(
    path: Path, offset: int, limit: int | None, max_bytes: int | None = None
) -> Iterator[tuple[Sample, int]]:
    """Frames of `path` from `offset`: (sample, offset after it); stops at EOF or damage, after
    `limit` frames, or before a frame that would pass `max_bytes` read (the first always comes)."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        count = 0
        read = 0
        while limit is None or count < limit:
            head = handle.read(_FRAME.size)
            if not head:
                return
            if len(head) < _FRAME.size:
                logger.warning("%s: skipping a torn frame at byte %d", path, offset)
                return
            length, crc = _FRAME.unpack(head)
            if count and max_bytes is not None and read + length > max_bytes:
                return
            read += length
            payload = handle.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                logger.warning("%s: skipping a torn or damaged frame at byte %d", path, offset)
                return
            try:
                sample = decode_frame(payload)
            except SampleFormatError as exc:
                logger.warning(
                    "%s: skipping an undecodable frame at byte %d: %s", path, offset, exc
                )
                return
            offset += _FRAME.size + length
            count += 1
            yield sample, offset


def _count_frames(path: Path, offset: int) -> int:
    """How many whole frames `path` holds after `offset` (reads only the frame headers)."""
    size = path.stat().st_size
    count = 0
    with open(path, "rb") as handle:
        while offset + _FRAME.size <= size:
            handle.seek(offset)
            length, _ = _FRAME.unpack(handle.read(_FRAME.size))
            if offset + _FRAME.size + length > size:
                break
            offset += _FRAME.size + length
            count += 1
    return count


class SpillLog:
    """Spill segments under `root`, appended by any thread and replayed in order by one reader.

    `fsync=True` (default) makes every append durable before `append` returns: spilling happens
    only when the destination is failing or slow, so durability wins over speed there.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self._fsync = fsync
        self._lock = threading.Lock()
        name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.folder = self.root / name
        """This process's folder, made on the first spill (`_own_folder`)."""
        self._lock_file: IO[bytes] | None = None
        self._segments: list[_Segment] = []
        self._adopted: list[tuple[Path, IO[bytes]]] = []
        self._next_seq = _FIRST_SEQ
        self._front_seq = _FIRST_SEQ - 1
        self._writer: IO[bytes] | None = None
        try:
            self._adopt_orphans()
        except OSError as exc:
            msg = f"cannot open spill folder {self.root}: {exc}"
            raise SinkError(msg, retryable=False) from exc
        self.spilled_samples = 0
        """Samples appended by this process (adopted ones not included)."""

    def _own_folder(self) -> None:
        """Make and lock this process's folder, on the first spill (called under `_lock`). The
        lock file gets its name only once locked, so no other process takes the folder for the
        one of a dead process meanwhile."""
        if self._lock_file is not None:
            return
        pending = self.folder / f"{_LOCK}.new"
        try:
            for attempt in range(3):  # another log's close may remove an empty root meanwhile
                try:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            handle = open(pending, "wb")  # noqa: SIM115 - held until close
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.replace(pending, self.folder / _LOCK)
        except OSError as exc:
            msg = f"cannot create spill folder {self.folder}: {exc}"
            raise SinkError(msg, retryable=True) from exc
        self._lock_file = handle

    # ---- adoption of folders left by dead processes ----

    def _adopt_orphans(self) -> None:
        if not self.root.is_dir():
            return  # nothing spilled here yet
        folders = sorted(
            p for p in self.root.iterdir() if p != self.folder and (p / _LOCK).is_file()
        )
        for folder in folders:
            try:
                handle = open(folder / _LOCK, "rb")  # noqa: SIM115 - held until replayed
            except OSError:
                continue
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()  # a live process owns it
                continue
            segments = sorted(folder.glob(f"*{_SUFFIX}"))
            for path in segments:
                offset = _read_offset(path)
                frames = _count_frames(path, offset)
                self._segments.append(_Segment(path, frames, sealed=True, offset=offset))
            self._adopted.append((folder, handle))
            if segments:
                logger.warning(
                    "adopting %d spill segment(s) with %d sample(s) left by a previous process in %s",
                    len(segments),
                    sum(s.frames for s in self._segments),
                    folder,
                )

    # ---- writing ----

    def append(self, samples: Sequence[Sample]) -> None:
        """Append samples durably; `SinkError(retryable=True)` if the disk refuses (e.g. full)."""
        if not samples:
            return
        data = _frames(samples)
        with self._lock:
            self._own_folder()
            segment = self._active_segment()
            assert self._writer is not None
            fd = self._writer.fileno()
            start = os.fstat(fd).st_size
            try:
                _write_all(fd, data)
                if self._fsync:
                    os.fsync(fd)
            except OSError as exc:
                _truncate_quietly(fd, start)  # never leave half a frame behind
                raise SinkError(f"cannot spill to {segment.path}: {exc}", retryable=True) from exc
            segment.frames += len(samples)
            self.spilled_samples += len(samples)

    def prepend(self, samples: Sequence[Sample]) -> None:
        """Write samples durably as a segment replayed before every segment this log spilled
        itself: for samples accepted before all of those (they waited in memory, or in flight,
        when the destination failed), so replay keeps acceptance order. Whole or not at all:
        `SinkError(retryable=True)` if the disk refuses, and nothing is left behind."""
        if not samples:
            return
        data = _frames(samples)
        with self._lock:
            self._own_folder()
            path = self.folder / f"{self._front_seq:010d}{_SUFFIX}"
            self._front_seq -= 1
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                try:
                    _write_all(fd, data)
                    if self._fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                path.unlink(missing_ok=True)
                raise SinkError(f"cannot spill to {path}: {exc}", retryable=True) from exc
            own = (i for i, s in enumerate(self._segments) if s.path.parent == self.folder)
            index = next(own, len(self._segments))  # after adopted folders: they are older
            self._segments.insert(index, _Segment(path, len(samples), sealed=True))
            self.spilled_samples += len(samples)

    def _active_segment(self) -> _Segment:
        if self._writer is None or not self._segments or self._segments[-1].sealed:
            path = self.folder / f"{self._next_seq:010d}{_SUFFIX}"
            self._next_seq += 1
            try:
                self._writer = open(path, "ab", buffering=0)  # noqa: SIM115 - kept open
            except OSError as exc:
                msg = f"cannot create spill segment {path}: {exc}"
                raise SinkError(msg, retryable=True) from exc
            self._segments.append(_Segment(path, 0, sealed=False))
        return self._segments[-1]

    # ---- replay ----

    @property
    def pending(self) -> int:
        """Samples in the log not yet committed as delivered."""
        with self._lock:
            return sum(s.frames for s in self._segments)

    def read_batch(self, max_samples: int, max_bytes: int | None = None) -> SpillBatch | None:
        """The next samples in order from the oldest segment (at most `max_samples`, and frames
        of at most `max_bytes` unless the first alone is larger), or None when the log is empty."""
        with self._lock:
            while self._segments:
                segment = self._segments[0]
                if not segment.sealed:
                    if segment.frames == 0:
                        return None
                    self._seal_active()
                try:
                    frames = _read_frames(segment.path, segment.offset, max_samples, max_bytes)
                    pairs = list(frames)
                except OSError as exc:  # removed or unreadable: nothing more can come from it
                    logger.error(
                        "cannot read spill segment %s (%d samples in it are lost): %s",
                        segment.path,
                        segment.frames,
                        exc,
                    )
                    pairs = []
                if pairs:
                    return SpillBatch([s for s, _ in pairs], segment.path, pairs[-1][1])
                self._drop_segment(segment)  # fully replayed, or the rest is torn
            return None

    def commit(self, batch: SpillBatch) -> None:
        """Record that `batch` was delivered; a segment replayed to its end is deleted."""
        with self._lock:
            segment = next((s for s in self._segments if s.path == batch.segment), None)
            if segment is None:
                return
            delivered = len(batch.samples)
            segment.frames = max(0, segment.frames - delivered)
            segment.offset = batch.end_offset
            try:
                replayed = segment.sealed and segment.offset >= segment.path.stat().st_size
            except OSError:
                replayed = True
            if segment.frames == 0 or replayed:
                self._drop_segment(segment)
            else:
                _write_offset(segment.path, segment.offset)

    def _seal_active(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._segments:
            self._segments[-1].sealed = True

    def _drop_segment(self, segment: _Segment) -> None:
        self._segments.remove(segment)
        for path in (segment.path, segment.path.with_suffix(".offset")):
            path.unlink(missing_ok=True)
        self._release_replayed_orphans()

    def _release_replayed_orphans(self) -> None:
        live = {s.path.parent for s in self._segments}
        for folder, handle in list(self._adopted):
            if folder not in live:
                (folder / _LOCK).unlink(missing_ok=True)
                handle.close()
                _rmdir_quietly(folder)
                self._adopted.remove((folder, handle))

    def close(self) -> None:
        """Close files. Undelivered segments stay on disk for the next spill log on this root;
        this log's folder and the root are removed once empty."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            empty = not any(s.frames for s in self._segments if s.path.parent == self.folder)
            if empty:
                for segment in [s for s in self._segments if s.path.parent == self.folder]:
                    segment.path.unlink(missing_ok=True)
                    segment.path.with_suffix(".offset").unlink(missing_ok=True)
            for _, handle in self._adopted:
                handle.close()
            self._adopted.clear()
            if self._lock_file is not None:
                if empty:
                    (self.folder / _LOCK).unlink(missing_ok=True)
                self._lock_file.close()
                self._lock_file = None
                if empty:
                    _rmdir_quietly(self.folder)
            _rmdir_quietly(self.root)  # only if empty: no other process's folder, no segment


def _frames(samples: Sequence[Sample]) -> bytearray:
    data = bytearray()
    for sample in samples:
        frame = encode_frame(sample)
        data += _FRAME.pack(len(frame), zlib.crc32(frame))
        data += frame
    return data


def _read_offset(segment: Path) -> int:
    try:
        return int(segment.with_suffix(".offset").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _write_offset(segment: Path, offset: int) -> None:
    target = segment.with_suffix(".offset")
    tmp = target.with_suffix(".offset.tmp")
    try:
        tmp.write_text(str(offset))
        os.replace(tmp, target)
    except OSError as exc:  # progress is an optimisation: losing it only replays duplicates
        logger.warning("cannot record spill progress in %s: %s", target, exc)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _truncate_quietly(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        logger.warning("cannot truncate a failed spill append: %s", exc)


def _rmdir_quietly(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty, or already gone
        folder.rmdir()
