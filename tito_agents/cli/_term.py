"""Terminal output helpers: ANSI styles that switch off cleanly, aligned tables, number formats.

Colour is on when stdout is a terminal and `NO_COLOR` is unset (`--color always|never` overrides),
so piped output and tests see plain text.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

RESET = "\x1b[0m"
STYLES = {
    "bold": "1",
    "dim": "2",
    "underline": "4",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
    "grey": "90",
}


def color_enabled(choice: str, stream: TextIO | None = None) -> bool:
    """Whether to emit ANSI colour for `--color auto|always|never` on `stream` (default stdout)."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    stream = stream if stream is not None else sys.stdout
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    return is_tty and not os.environ.get("NO_COLOR")


class Painter:
    """Wraps text in ANSI codes when enabled; returns it unchanged otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        codes = ";".join(STYLES.get(s, s) for s in styles)
        return f"\x1b[{codes}m{text}{RESET}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, indent: str = "") -> str:
    """Rows as an aligned plain-text table; numbers right-aligned, text left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [
        any(_is_number(row[i]) for row in rows)
        and all(_is_number(row[i]) or row[i] in ("", None) for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return (indent + "  ".join(parts)).rstrip()

    out = [line(headers), indent + "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return "" if value is None else str(value)


def percent(part: int | float, whole: int | float) -> str:
    """`part/whole` as a percentage with one decimal; `-` when `whole` is 0."""
    return "-" if not whole else f"{100.0 * part / whole:.1f}%"


def human_bytes(size: int) -> str:
    """A byte count for people: `512 B`, `1.5 KB`, `3.2 GB` (powers of 1000)."""
    value = float(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")
