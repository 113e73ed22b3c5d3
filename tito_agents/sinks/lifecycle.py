"""At-exit safety net: a sink left open when the program exits is warned about and closed.

Sinks that hold samples in memory (buffers, batches, unfinished files) register here. At interpreter
exit, each one still open gets an `UnclosedSinkWarning` (also logged) and a last bounded `close`, so
a forgotten `close()` costs a warning, not silent loss. What cannot be delivered in that time is
spilled (buffered sinks) or left in a recoverable in-progress file (file sinks), and the warning
says where.

The interface, within the package (not the user API): sinks that hold samples call `track`;
whatever feeds sinks from a queue of its own (the collector's processor thread) calls `drain_before_close`,
so its queue reaches the sinks before their last close.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import warnings
import weakref
from typing import Protocol

__all__ = [
    "EXIT_TIMEOUT",
    "ClosesAtExit",
    "DrainsAtExit",
    "UnclosedSinkWarning",
    "close_unclosed",
    "drain_before_close",
    "track",
]

logger = logging.getLogger("tito_agents.sinks")

EXIT_TIMEOUT = 10.0
"""Seconds each unclosed sink gets to drain at exit."""


class UnclosedSinkWarning(UserWarning):
    """A sink was still open at exit; it was closed by the at-exit hook (see the message)."""


class ClosesAtExit(Protocol):
    @property
    def closed(self) -> bool: ...

    def close_at_exit(self, timeout: float) -> str:
        """Close within `timeout` seconds; return what happened to pending samples."""
        ...


class DrainsAtExit(Protocol):
    def drain(self, timeout: float | None = None) -> bool:
        """Hand what is queued to its sink within `timeout` seconds; True if all of it was."""
        ...


_open: weakref.WeakSet[ClosesAtExit] = weakref.WeakSet()
_feeders: weakref.WeakSet[DrainsAtExit] = weakref.WeakSet()
_lock = threading.Lock()


def drain_before_close(feeder: DrainsAtExit) -> None:
    """Drain `feeder` at exit before any sink is closed: something that feeds sinks from a queue
    of its own (the collector's processor thread, `tito-processor`), whose samples would
    otherwise miss the sinks' last close."""
    with _lock:
        _feeders.add(feeder)
        atexit.unregister(close_unclosed)
        atexit.register(close_unclosed)


def track(sink: ClosesAtExit) -> None:
    """Watch `sink` until exit; untracked automatically when it is garbage-collected.

    The hook is re-registered on every call so that it runs before the exit handlers of
    libraries initialised earlier (at-exit handlers run last-registered first): Ray's shutdown
    must not come before unread Ray batches are handed over.
    """
    with _lock:
        _open.add(sink)
        atexit.unregister(close_unclosed)
        atexit.register(close_unclosed)


def _forget_after_fork() -> None:
    """A forked child did not open its parent's sinks and must not close them at its exit (a
    `BufferedSink` re-registers itself: it gets a fresh state in the child)."""
    _open.clear()
    _feeders.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def close_unclosed(timeout: float = EXIT_TIMEOUT) -> int:
    """Close every tracked sink still open (the at-exit hook); returns how many there were.

    Wrappers (sinks with an `inner` sink, like `BufferedSink`) are closed first: they deliver
    their buffer to the inner sink, then close it.
    """
    with _lock:
        feeders = list(_feeders)
    for feeder in feeders:
        try:
            if not feeder.drain(timeout):
                logger.warning(
                    "%r did not hand over its queue within %.0fs at exit", feeder, timeout
                )
        except Exception as exc:  # the hook must reach every sink
            logger.warning("draining %r at exit failed: %r", feeder, exc)
    with _lock:
        pending = [sink for sink in list(_open) if not sink.closed]
    pending.sort(key=lambda sink: 0 if hasattr(sink, "inner") else 1)
    closed = 0
    for sink in pending:
        if sink.closed:  # closed by its wrapper
            continue
        closed += 1
        try:
            outcome = sink.close_at_exit(timeout)
        except Exception as exc:  # the hook must reach every sink
            outcome = f"closing failed: {exc!r}"
        message = f"{sink!r} was not closed before exit; {outcome}. Call close() to drain it."
        if logger.hasHandlers():  # unconfigured, logging's last resort would print it twice
            logger.warning("%s", message)
        warnings.warn(message, UnclosedSinkWarning, stacklevel=1)
    return closed
