"""Helpers for testing and benchmarking sinks: synthetic samples and a throwaway local redis-server.

Shipped with the library (like `tito_agents.testing`) so users can test their own sink set-ups
without a model or a vLLM server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import numpy as np

from tito_agents.errors import ConfigurationError
from tito_agents.samples import CallSpan, Sample


def synthetic_sample(
    index: int,
    num_tokens: int = 64,
    *,
    trained_fraction: float = 0.4,
    logprobs: bool = True,
    episode_id: str | None = None,
    seed: int | None = None,
) -> Sample:
    """A valid per-call sample with random ids: prompt, then `trained_fraction` sampled tokens."""
    rng = np.random.default_rng(index if seed is None else seed)
    token_ids = rng.integers(0, 49_152, num_tokens, dtype=np.int32)
    start = num_tokens - int(num_tokens * trained_fraction)
    loss_mask = np.zeros(num_tokens, dtype=np.uint8)
    loss_mask[start:] = 1
    lp = None
    if logprobs:
        lp = np.zeros(num_tokens, dtype=np.float32)
        lp[start:] = -rng.random(num_tokens - start, dtype=np.float32)
    episode = episode_id or f"ep{index // 4}"
    call_id = f"chatcmpl-{index}/0"
    return Sample(
        sample_id=f"{episode}/{index}",
        episode_id=episode,
        agent="main",
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=lp,
        reward=float(index % 3) / 2,
        call_ids=[call_id],
        spans=[CallSpan(call_id, 0, start, num_tokens, finish_reason="stop")],
        task_id=f"task{index // 8}",
        group_id=f"group{index // 8}",
        model="SmolLM2-135M-Instruct",
        metadata={"index": index},
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalRedisServer:
    """A `redis-server` child process on 127.0.0.1, with AOF persistence (fsync always) in a
    temporary folder, so that a kill and `restart()` keep every acknowledged write.

    `extra_args` are passed to redis-server (e.g. ``["--requirepass", "secret"]``).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        extra_args: list[str] | None = None,
        binary: str = "redis-server",
        appendfsync: str = "always",
    ) -> None:
        path = shutil.which(binary)
        if path is None:
            raise ConfigurationError(
                f"{binary} not found: install it (Debian/Ubuntu: apt-get install redis-server)"
            )
        self.binary = path
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.appendfsync = appendfsync
        self.folder = Path(tempfile.mkdtemp(prefix="tito-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {err.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not listen on {self.port} within {timeout}s")

    def kill(self) -> None:
        """Kill -9 (a crash): no shutdown save; AOF keeps what was acknowledged."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """A clean shutdown."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            if process is not None and process.stderr:
                process.stderr.close()
            return
        os.kill(process.pid, sig)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stderr:
            process.stderr.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LocalRedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
