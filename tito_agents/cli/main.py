"""The `tito-agents` console command: argument parsing, dispatch, and the one-line error policy.

Subcommands live in their own modules (`audit.command`, `compare`, `drift.command`, `serve`,
`show`, `stats`), each with `add_parser` and `run(args) -> exit code`. Bad input of any kind ends
as one line on stderr naming the file and the problem, with exit code 2; `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from tito_agents import __version__
from tito_agents.cli import compare, serve, show, stats
from tito_agents.cli._errors import EXIT_BAD_INPUT, CliInputError
from tito_agents.cli.audit import command as audit
from tito_agents.cli.drift import command as drift
from tito_agents.errors import TitoError

__all__ = ["build_parser", "main"]

PROG = "tito-agents"


def build_parser() -> argparse.ArgumentParser:
    """The command's parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect tito-agents samples and audit chat templates before training.",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-line errors"
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (audit, compare, drift, serve, show, stats):
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with `argv` (default: `sys.argv[1:]`) and return its exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(_debug_first(arguments))
    handler = _StderrHandler()
    library_logger = logging.getLogger("tito_agents")
    library_logger.addHandler(handler)
    try:
        code: int = args.handler(args)
        return code
    except (CliInputError, TitoError, OSError) as exc:
        if args.debug:
            raise
        sys.stderr.write(f"{PROG}: error: {_one_line(exc)}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:  # pragma: no cover - `tito-agents show ... | head`
        return 0
    finally:
        library_logger.removeHandler(handler)


class _StderrHandler(logging.Handler):
    """Library warnings (e.g. a skipped torn line) as `tito-agents: warning: ...` on the stderr of
    the moment (installed only while a command runs)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(f"{PROG}: warning: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # a broken stderr must not turn a warning into a crash
            self.handleError(record)


def _debug_first(arguments: list[str]) -> list[str]:
    """Accept `--debug` anywhere on the line (argparse only knows it before the subcommand)."""
    if "--debug" in arguments:
        return ["--debug", *(a for a in arguments if a != "--debug")]
    return arguments


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())
