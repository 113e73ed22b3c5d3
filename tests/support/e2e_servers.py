"""The real CPU vLLM servers of the e2e tier: one per configuration (`ServerConfig`), started once
per session by `VllmServers` through scripts/vllm_server.py (loaded by path), and the small tools
their tests share (`environ`, `paused_alarm`). The fixtures that hand them out live in
tests/e2e/conftest.py; tests import these names from here, never from a conftest."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tito_agents.sinks.harness import free_port

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_server.py"
_MODULE_NAME = "tito_vllm_server_script"
SERVER_FIXTURES = ("vllm_base_url", "vllm_model", "vllm_scale_out_url", "vllm_processed_url")
# Per-test limit for the e2e tier (the slowest test takes ~2 min on an idle 2-core machine, and
# CI machines have been 7x slower); tests that need more carry their own `timeout` mark.
E2E_TIMEOUT = 900


def load_vllm_server_script() -> ModuleType:
    """Import scripts/vllm_server.py by path (it is not part of a package)."""
    mod = sys.modules.get(_MODULE_NAME)
    if mod is None:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, _SCRIPT)
        assert spec is not None and spec.loader is not None, _SCRIPT
        mod = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE_NAME] = mod
        spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block (the script reads its settings from there)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def paused_alarm() -> Iterator[None]:
    """Pause the per-test alarm (pytest-timeout's signal method) while a server starts."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, remaining)


@dataclass(frozen=True)
class ServerConfig:
    """How a vLLM is started: extra flags (``TITO_VLLM_EXTRA_ARGS``) and the weights it serves
    (``TITO_VLLM_MODEL_DIR``; None: the converted SmolLM2). Equal configurations share a server."""

    extra_args: str = ""
    model_dir: str | None = None
    dev_mode: bool = False
    """vLLM's dev mode (``VLLM_SERVER_DEV_MODE=1``): the weight routes (`/collective_rpc`,
    `/pause`, `/update_weight_version`, ...) that `tito_agents.rl` updates weights in place with."""

    def env(self, port: int) -> dict[str, str]:
        values = {"TITO_VLLM_PORT": str(port), "TITO_VLLM_EXTRA_ARGS": self.extra_args}
        if self.model_dir is not None:
            values["TITO_VLLM_MODEL_DIR"] = self.model_dir
        if self.dev_mode:
            values["VLLM_SERVER_DEV_MODE"] = "1"
        return values


STANDARD = ServerConfig()
DEV_MODE = ServerConfig(dev_mode=True)
"""The one dev-mode server the RL e2e tests share (each puts the original weights back)."""

SCALE_OUT = ServerConfig(extra_args="--enable-scale-out")
"""A server with vLLM's scale-out routes (`/v1/messages/render`: the ids of its own rendering of a
Messages request). Harmless to add to the standard server's flags (`TITO_VLLM_EXTRA_ARGS`): then
`vllm_scale_out_url` uses it and no second server starts."""

PROCESSED_LOGPROBS_SERVER = ServerConfig(extra_args="--logprobs-mode processed_logprobs")
"""A server that returns the logprobs of the distribution it sampled from (after temperature and
top-k/top-p/min-p; vLLM's `--logprobs-mode` is server-wide, so this is a server of its own unless
the standard one already runs that mode)."""


def dev_server_url(servers: VllmServers) -> str:
    """Base URL of a dev-mode vLLM serving the converted SmolLM2: ``TITO_VLLM_DEV_URL`` when set
    (a server already running, left running), else the session's `DEV_MODE` server."""
    return os.environ.get("TITO_VLLM_DEV_URL") or servers.url(DEV_MODE)


@dataclass
class _Server:
    port: int
    url: str | None = None
    started_here: bool = False
    failure: str | None = None  # one line, set once start-up failed


class VllmServers:
    """The session's servers, one per configuration; stop() stops those this session started."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._servers: dict[ServerConfig, _Server] = {}

    def failure(self, config: ServerConfig = STANDARD) -> str | None:
        server = self._servers.get(config)
        return server.failure if server else None

    def url(self, config: ServerConfig = STANDARD) -> str:
        """Base URL (``http://127.0.0.1:PORT/v1``) of a ready server of this configuration."""
        server = self._servers.get(config)
        if server is None:
            mod = load_vllm_server_script()
            port = int(mod.port()) if config == STANDARD else free_port()
            server = self._servers[config] = _Server(port)
        if server.failure is not None:
            pytest.fail(f"real vLLM unavailable: {server.failure}", pytrace=False)
        if server.url is None:
            server.url = self._start(config, server)
        return server.url

    def _start(self, config: ServerConfig, server: _Server) -> str:
        mod = load_vllm_server_script()
        timeout = float(os.environ.get("TITO_VLLM_START_TIMEOUT") or mod.DEFAULT_START_TIMEOUT)
        capman: Any = self._config.pluginmanager.getplugin("capturemanager")
        # the standard server keeps the caller's extra flags; another configuration has its own
        env = (
            {"TITO_VLLM_PORT": str(server.port)} if config == STANDARD else config.env(server.port)
        )
        try:
            with (
                environ(**env),
                paused_alarm(),
                # Show the script's progress (install, conversion, start-up dots) live.
                capman.global_and_fixture_disabled() if capman else contextlib.nullcontext(),
            ):
                if mod.is_ready():  # not ours to stop; say which server the tier runs against
                    print(f"\n[e2e] reusing the vLLM ready on {mod.describe()}", flush=True)
                    return str(mod.base_url())
                url = str(mod.start(timeout=timeout))
                server.started_here = True
                return url
        except mod.VllmServerError as exc:
            server.failure = exc.one_line()
            pytest.fail(f"real vLLM unavailable: {exc}", pytrace=False)
        except Exception as exc:  # anything unexpected: still do not retry per test
            server.failure = f"{type(exc).__name__}: {exc}"
            raise

    def stop(self) -> None:
        mod = load_vllm_server_script()
        for config, server in reversed(self._servers.items()):
            if server.started_here:
                server.started_here = False
                with environ(**config.env(server.port)):
                    mod.stop()


def one_compute_thread() -> None:
    """One OpenMP thread for this process's own torch work (the trainer side of the RL tests):
    the vLLM server beside it busy-polls a core, and two torch threads spinning at OpenMP
    barriers on the core left run several times slower than one (measured on 2 cores: two TRL
    GRPO steps 222 s with 2 threads, 127 s with 1). A thread count the caller set is kept."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = "1"  # read by torch (and subprocesses) when it starts
    torch = sys.modules.get("torch")
    if torch is not None:  # already imported by an earlier conftest or plugin
        torch.set_num_threads(1)
