"""Finding one sample in JSON Lines files without parsing the others.

Building the 47,000 samples before `show --index 47000` (token arrays and validation) would take
7 s and more on a large file. Here each line is only peeked at: its sample id and episode id come from
the head of the line (the sinks write `{"schema":..,"sample_id":..,"episode_id":..` first) and its
view from its tail (`"view":..}` last; `start_reason` after the spans in files written before
`view` existed). Only the target and the merged samples of its episode (its possible parents and
children, for the rewrite points) are parsed. A line written in another key order is parsed
whole, so any valid JSON Lines file gives the same answer as the plain reader, only slower.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from tito_agents.cli._errors import CliInputError
from tito_agents.errors import SampleFormatError
from tito_agents.samples import Sample

__all__ = ["LineEntry", "iter_entries"]

_HEAD = re.compile(
    rb'\{"schema":\d+,"sample_id":("(?:[^"\\]|\\.)*"),"episode_id":("(?:[^"\\]|\\.)*"),'
)
_VIEW_TAIL = {b',"view":"per_call"}': False, b',"view":"merged"}': True}
_OLD_START_REASON = b'],"start_reason":"'


@dataclass(slots=True)
class LineEntry:
    """One line of a samples file, parsed only as far as the search needs.

    `line` is kept only when the sample may be needed (a possible target, or a merged sample of
    the episode being read); `parsed` when the line had to be parsed whole to be read at all.
    """

    sample_id: str
    episode_id: str
    merged: bool
    where: str
    line: bytes | None = None
    parsed: Sample | None = None

    def sample(self) -> Sample:
        """The sample of this line (parsed now, once)."""
        if self.parsed is None:
            if self.line is None:  # pragma: no cover - the search keeps what it returns
                raise CliInputError(None, f"{self.where}: sample {self.sample_id} was not kept")
            self.parsed = _parse(self.line, self.where)
        return self.parsed


def iter_entries(
    paths: Sequence[Path], *, keep_id: str | None, keep_index: int | None
) -> Iterator[LineEntry]:
    """The lines of `paths` in order as entries. A line's bytes are kept when its sample is merged
    or may be the target (`keep_index`-th sample, or an id starting with `keep_id`). A torn last
    line is skipped (the file was opened with `--allow-truncated`, else refused before)."""
    index = 0
    for path in paths:
        with open(path, "rb") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                entry = _peek(line, where)
                if entry is None:
                    try:
                        data = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        if not line.endswith(b"\n"):
                            return  # a torn last line, as the plain reader skips it
                        raise CliInputError(None, f"{where}: not JSON") from None
                    sample = _from_dict(data, where)
                    entry = LineEntry(
                        sample.sample_id, sample.episode_id, sample.view == "merged", where
                    )
                    entry.parsed = sample
                elif (
                    entry.merged
                    or index == keep_index
                    or (keep_id is not None and entry.sample_id.startswith(keep_id))
                ):
                    entry.line = line
                yield entry
                index += 1


def _peek(line: bytes, where: str) -> LineEntry | None:
    """Ids and view from the line's head and tail, or None when it is not laid out as the sinks
    write it (then it is parsed whole)."""
    if not line.endswith(b"\n"):
        return None  # possibly torn: parse it whole to tell
    head = _HEAD.match(line)
    if head is None:
        return None
    tail = line.rstrip()
    merged = next((m for end, m in _VIEW_TAIL.items() if tail.endswith(end)), None)
    if merged is None and b'"view":' not in tail[-64:]:
        cut = line.find(_OLD_START_REASON)
        if cut < 0:
            return None
        merged = not line.startswith(b'call"', cut + len(_OLD_START_REASON))
    if merged is None:
        return None
    try:
        sample_id, episode_id = orjson.loads(head[1]), orjson.loads(head[2])
    except orjson.JSONDecodeError:
        return None
    return LineEntry(str(sample_id), str(episode_id), merged, where)


def _parse(line: bytes, where: str) -> Sample:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CliInputError(None, f"{where}: not JSON ({exc})") from exc
    return _from_dict(data, where)


def _from_dict(data: object, where: str) -> Sample:
    try:
        return Sample.from_dict(data)
    except SampleFormatError as exc:
        raise CliInputError(None, f"{where}: {exc}") from exc
