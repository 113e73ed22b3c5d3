"""The restart journal: which episodes were open, so a restarted gateway can say which were lost.

An episode lives in the gateway's memory from its open to its close; its samples are written
whole at the close, never before. A gateway that stops (crash, kill, deploy) with episodes open
therefore writes nothing for them, and this journal is how the next gateway on the same state
file reports them: one JSON line per open and per close, appended (no fsync: a process crash
keeps what the kernel has; a torn last line is skipped). At start the file is read, the episodes
opened and never closed become *lost*, and the file is rewritten holding only those, so it stays
as small as the number of open and lost episodes. Default location (`tito-agents serve`):
`tito_agents._state_dirs.gateway_journal_path`, under the state root ``$TITO_CACHE_DIR``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import IO, Any

import orjson

logger = logging.getLogger("tito_agents.gateway")

MAX_LOST = 10_000
"""Lost episodes remembered across restarts (the oldest are forgotten beyond it)."""


class Journal:
    """Append-only record of episode opens and closes in one file (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None

    def recover(self) -> dict[str, dict[str, Any]]:
        """Read what a previous gateway left: the episodes it had open (and those it had already
        reported lost), as {episode id: what was known at open}. Rewrites the file to hold only
        those, and opens it for appending."""
        lost: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            with self.path.open("rb") as handle:
                for line in handle:
                    try:
                        entry = orjson.loads(line)
                        op, episode_id = entry["op"], entry["id"]
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        continue  # a torn last line (the process died mid-write)
                    if op in ("open", "lost"):
                        lost[episode_id] = entry
                    elif op in ("close", "forget"):
                        lost.pop(episode_id, None)
        for entry in lost.values():
            entry["op"] = "lost"
        kept = list(lost.values())[-MAX_LOST:]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("wb") as handle:
            handle.writelines(orjson.dumps(entry) + b"\n" for entry in kept)
        os.replace(tmp, self.path)
        self._file = self.path.open("ab", buffering=0)
        return {entry["id"]: entry for entry in kept}

    def opened(self, episode_id: str, **info: Any) -> None:
        self._append({"op": "open", "id": episode_id, "at": time.time(), **info})

    def closed(self, episode_id: str) -> None:
        self._append({"op": "close", "id": episode_id})

    def forgotten(self, episode_id: str) -> None:
        """A lost episode was acknowledged (closed through the control API)."""
        self._append({"op": "forget", "id": episode_id})

    def _append(self, entry: dict[str, Any]) -> None:
        if self._file is None:
            return
        try:
            self._file.write(orjson.dumps(entry) + b"\n")
        except OSError:  # a full disk must not fail the episode; the restart report is weaker
            logger.warning("could not write the gateway journal %s", self.path, exc_info=True)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
