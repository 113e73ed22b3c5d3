"""Paths the user types and files the command writes.

`~` is expanded in every path the command takes (as the library's sinks and
`read_samples` do): a quoted `'~/out.html'` or `--html=~/out.html` reaches us unexpanded,
since the shell leaves `~` alone there. Written files (`show --html`, `compare --html`) go to a
hidden temporary file in the same folder, renamed into place once complete, so a failed or
interrupted write never leaves a partial page that looks finished.
"""

from __future__ import annotations

import os
from pathlib import Path

from tito_agents.cli._errors import CliInputError

__all__ = ["user_path", "write_output"]


def user_path(spec: str | os.PathLike[str]) -> Path:
    """`spec` as a path, with a leading `~` / `~user` expanded."""
    return Path(os.fspath(spec)).expanduser()


def write_output(spec: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `spec` (UTF-8) atomically and return the path written.

    Folders are never created (a typo would scatter files around); a missing folder, a folder
    given as the file, or a failed write is a `CliInputError` naming the output, and leaves
    nothing behind at that path (an earlier file there is kept)."""
    out = user_path(spec)
    if not out.parent.is_dir():
        raise CliInputError(out, f"cannot write: folder {out.parent} does not exist")
    if out.is_dir():
        raise CliInputError(out, "cannot write: it is a folder (give a file name)")
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise CliInputError(out, f"cannot write: {exc.strerror or exc}") from exc
    except BaseException:  # interrupted (Ctrl-C) mid-write: no partial file either
        partial.unlink(missing_ok=True)
        raise
    return out
