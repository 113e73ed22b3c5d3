"""The one error the command reports as a single line: an input it cannot use.

Every bad input (not a samples file, a truncated file, a template that fails to render, a tokenizer
that cannot be loaded) becomes a `CliInputError` naming the file and the problem; `main` prints it
on one line and exits with `EXIT_BAD_INPUT` (a traceback only with `--debug`).
"""

from __future__ import annotations

import os

from tito_agents.errors import TitoError

EXIT_OK = 0
EXIT_FINDINGS = 1
"""The command ran and found problems (an audit case failed, drift was found with `--fail-on-drift`)."""
EXIT_BAD_INPUT = 2
"""An input could not be used; nothing, or only part, was reported."""


class CliInputError(TitoError):
    """An input of the command cannot be used: `path` names it, the message says why."""

    def __init__(self, path: str | os.PathLike[str] | None, problem: str) -> None:
        self.path = None if path is None else os.fspath(path)
        self.problem = problem
        super().__init__(problem if self.path is None else f"{self.path}: {problem}")
