"""A one-line progress bar on stderr for long scans; silent unless stderr is a terminal or forced.

Scans are streamed, so progress counts samples and, where the total is only estimated (JSON Lines),
shows `~` before it and never claims 100% before the end. Redraws are throttled by time, so the cost
per sample is one counter update and one clock read every `_CHECK_EVERY` samples.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_CHECK_EVERY = 64
_REDRAW_SECONDS = 0.2
_BAR_WIDTH = 24


class Progress:
    """Counts samples and tokens of a scan; draws on `stream` when `enabled`.

    `total` is the expected number of samples (None when unknown); `estimated` marks it as a guess.
    Use as a context manager: the line is cleared on exit.
    """

    def __init__(
        self,
        label: str,
        *,
        enabled: bool,
        total: int | None = None,
        estimated: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        self.label = label
        self.enabled = enabled
        self.total = total
        self.estimated = estimated
        self.samples = 0
        self.tokens = 0
        self._stream = stream if stream is not None else sys.stderr
        self._started = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, tokens: int = 0) -> None:
        """Count one sample of `tokens` tokens; redraw at most every `_REDRAW_SECONDS`."""
        self.samples += 1
        self.tokens += tokens
        if self.enabled and self.samples % _CHECK_EVERY == 0:
            now = time.perf_counter()
            if now - self._last_draw >= _REDRAW_SECONDS:
                self._last_draw = now
                self._draw(now)

    def render(self, now: float | None = None) -> str:
        """The progress line as text (without carriage return)."""
        now = time.perf_counter() if now is None else now
        elapsed = max(now - self._started, 1e-9)
        rate = self.samples / elapsed
        parts = [self.label]
        if self.total:
            fraction = min(self.samples / self.total, 0.99 if self.estimated else 1.0)
            filled = int(fraction * _BAR_WIDTH)
            bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
            mark = "~" if self.estimated else ""
            parts.append(f"[{bar}] {fraction:4.0%} {self.samples:,}/{mark}{self.total:,}")
        else:
            parts.append(f"{self.samples:,} samples")
        parts.append(f"{self.tokens:,} tokens {rate:,.0f} samples/s")
        return " ".join(parts)

    def _draw(self, now: float) -> None:
        self._stream.write("\r\x1b[2K" + self.render(now))
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Clear the progress line, so the command's own output starts on a clean line."""
        if self._drawn:
            self._stream.write("\r\x1b[2K")
            self._stream.flush()
            self._drawn = False


def progress_enabled(forced: bool, stream: TextIO | None = None) -> bool:
    """Progress is drawn when forced (`--progress`) or when stderr is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    return forced or bool(getattr(stream, "isatty", lambda: False)())
