"""Part files on disk: naming, atomic finalize, recovery of unfinished parts, listing (read
them with `tito_agents.read_samples`).

A finished part is ``<stem>-<run>-<index><suffix>``; while it is written it lives under the hidden
name ``.<stem>-<run>-<index><suffix>.inprogress.<kind>`` (``kind``: ``arrows`` for an Arrow stream
journal, ``jsonl``), locked by its writer. Finalizing is fsync, rename, fsync of the folder, so a
reader that lists finished parts never sees half a file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path
from typing import Any

logger = logging.getLogger("tito_agents.sinks")

JOURNAL = ".inprogress"
PART = re.compile(
    r"^(?P<stem>.+)-(?P<run>\d{8}T\d{6}-[0-9a-f]{6})-(?P<index>\d{6})(?P<suffix>\.\w+)$"
)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def conversion_path(final: Path) -> Path:
    """Where a Parquet part is built before its atomic rename (hidden, not a journal)."""
    return final.with_name(f".{final.name}.tmp")


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def final_name(journal: Path) -> Path:
    """The finalized name of an in-progress file (``.name.parquet.inprogress.arrows`` ->
    ``name.parquet``)."""
    name = journal.name
    return journal.with_name(name[1 : name.index(JOURNAL)])


def finalize_journal(
    journal: Path, final: Path, *, compression: str | None = "zstd", row_group_size: int = 1024
) -> None:
    """Turn a closed in-progress file into its final part atomically (fsync, rename, fsync dir).

    A Parquet part journaled as an Arrow stream is converted first (into a hidden temporary file);
    the journal is removed only after the Parquet file is in place. Raises OSError (e.g. disk full)
    leaving the journal intact.
    """
    kind = journal.name.rsplit(".", 1)[-1]
    if final.suffix == ".parquet" and kind == "arrows":
        from tito_agents.sinks import columnar

        tmp = conversion_path(final)
        try:
            columnar.convert_stream_to_parquet(journal, tmp, compression, row_group_size)
            fsync_file(tmp)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_folder(final.parent)
        journal.unlink()
        return
    fsync_file(journal)
    os.replace(journal, final)
    fsync_folder(final.parent)


# ---- recovery and reading ----


def _journals(folder: Path, stem: str | None, suffix: str | None) -> list[Path]:
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob(f".*{JOURNAL}.*"):
        match = PART.match(final_name(path).name)
        if match is None:
            continue
        if (stem is None or match["stem"] == stem) and (
            suffix is None or match["suffix"] == suffix
        ):
            found.append(path)
    return sorted(found, key=lambda p: _order_key(final_name(p)))


def recover_parts(
    folder: str | os.PathLike[str], *, stem: str | None = None, suffix: str | None = None
) -> tuple[int, int]:
    """Finalize the in-progress parts in `folder` whose writers died; returns (parts, samples).

    A torn tail (a crash mid-batch) is cut off first; parts being written by live processes are
    left alone (they hold a lock). A Parquet part is rebuilt from its Arrow stream journal.
    """
    parts = samples = 0
    for journal in _journals(Path(folder), stem, suffix):
        try:
            lock_fd = os.open(journal, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock_fd)
            continue  # a live writer holds it
        try:
            count = _recover_one(journal)
        finally:
            os.close(lock_fd)
        if count:
            parts += 1
            samples += count
    if parts:
        logger.warning(
            "recovered %d sample(s) in %d unfinished part(s) in %s", samples, parts, folder
        )
    return parts, samples


def _recover_one(journal: Path) -> int:
    final = final_name(journal)
    conversion_path(final).unlink(missing_ok=True)  # a dead writer's half-built Parquet file
    if final.exists():  # crashed after the rename, before removing the journal
        journal.unlink(missing_ok=True)
        return 0
    kind = journal.name.rsplit(".", 1)[-1]
    if kind == "arrows":
        from tito_agents.sinks import columnar

        count = columnar.repair_stream(journal)
    else:
        count = _repair_jsonl(journal)
    if count == 0:
        journal.unlink(missing_ok=True)
        return 0
    finalize_journal(journal, final)
    return count


def _repair_jsonl(journal: Path) -> int:
    data = journal.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        os.truncate(journal, keep)
    return data.count(b"\n", 0, keep)


def _order_key(path: Path) -> tuple[str, str, int]:
    match = PART.match(path.name)
    if match is None:
        return (path.name, "", 0)
    return (match["stem"], match["run"], int(match["index"]))


def list_parts(path: str | os.PathLike[str], *, include_in_progress: bool = False) -> list[Path]:
    """The part files a file sink wrote for `path` (a sink path, a folder or one file), in
    write order; with `include_in_progress`, unfinished parts too (their complete batches)."""
    base = Path(path).expanduser()
    if base.is_file():
        return [base]
    if base.is_dir():
        folder, stem, suffix = base, None, None
    else:
        folder, stem, suffix = base.parent, base.stem, base.suffix
    found: list[Path] = []
    if folder.is_dir():
        for candidate in folder.iterdir():
            match = PART.match(candidate.name)
            if match is None or candidate.name.startswith("."):
                continue
            if (stem is None or match["stem"] == stem) and (
                suffix is None or match["suffix"] == suffix
            ):
                found.append(candidate)
    parts = sorted(found, key=_order_key)
    if include_in_progress:
        journals = _journals(folder, stem, suffix)
        parts = sorted(
            parts + journals,
            key=lambda p: _order_key(final_name(p) if p.name.startswith(".") else p),
        )
    return parts


def read_file_table(path: str | os.PathLike[str]) -> Any:
    """The finalized Arrow or Parquet parts for `path` as one `pyarrow.Table`."""
    from tito_agents.sinks import columnar

    return columnar.read_table([p for p in list_parts(path) if p.suffix != ".jsonl"])
