"""What `vllm_server.py`'s set-up and running share: the settings (environment), the cache layout,
the port and URL, the error every step raises, progress output and the file lock.

Standard library only, like the rest of the script (it runs with the system ``python3``, before
any virtual environment exists). Settings are read from the environment on each call, so a
caller (the e2e fixtures) may change ``TITO_VLLM_PORT`` or ``TITO_CACHE_DIR`` between calls.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO

try:  # POSIX only; the lock is a nicety for concurrent starts
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PORT = 8765
HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().with_name("vllm_server.py")
"""The entry point (error messages name it: the modules beside it are its parts)."""
PREFIX = "[vllm_server]"


class VllmServerError(RuntimeError):
    """A step failed. ``reason`` is one short line, ``log_path`` the log to read (or None)."""

    def __init__(self, reason: str, log_path: Path | None = None, details: str = "") -> None:
        self.reason = reason
        self.log_path = Path(log_path) if log_path else None
        self.details = details
        msg = reason
        if self.log_path:
            msg += f" (see {self.log_path})"
        if details:
            msg += "\n" + details
        super().__init__(msg)

    def one_line(self) -> str:
        return self.reason + (f" (see {self.log_path})" if self.log_path else "")


def cache_dir() -> Path:
    return Path(os.environ.get("TITO_CACHE_DIR") or "~/.cache/tito-agents").expanduser().resolve()


def venv_dir() -> Path:
    return cache_dir() / "vllm-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def model_dir() -> Path:
    return cache_dir() / "models" / SERVED_MODEL_NAME


def served_model_dir() -> Path:
    """The weights folder vLLM serves: ``TITO_VLLM_MODEL_DIR`` if set, else the converted model."""
    override = os.environ.get("TITO_VLLM_MODEL_DIR")
    return Path(override).expanduser().resolve() if override else model_dir()


def logs_dir() -> Path:
    return cache_dir() / "logs"


def run_dir() -> Path:
    return cache_dir() / "run"


def port() -> int:
    raw = os.environ.get("TITO_VLLM_PORT") or str(DEFAULT_PORT)
    try:
        value = int(raw)
    except ValueError:
        raise VllmServerError(f"TITO_VLLM_PORT={raw!r} is not an integer") from None
    if not 0 < value < 65536:
        raise VllmServerError(f"TITO_VLLM_PORT={raw!r} is out of range")
    return value


def base_url(port_: int | None = None) -> str:
    return f"http://{HOST}:{port_ or port()}/v1"


def pid_file(port_: int | None = None) -> Path:
    return run_dir() / f"vllm-{port_ or port()}.pid"


def server_log(port_: int | None = None) -> Path:
    return run_dir() / f"vllm-{port_ or port()}.log"


def say(msg: str = "", end: str = "\n") -> None:
    """Progress on stderr: stdout carries only the answers (the URL, the state of `status`)."""
    print(msg, end=end, file=sys.stderr, flush=True)


def tail(path: Path, n: int = 30) -> str:
    """The last `n` lines of a log (from its last 64 KiB), quoted in error messages."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class Lock:
    """An exclusive `flock` on `path` for the block (none where fcntl is missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[str] | None = None

    def __enter__(self) -> Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = fh = open(self.path, "a")
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is None:
            return
        if fcntl is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
        self.fh = None
