"""scripts/vllm_server.py without a server: the command line from any directory, and the module
imported by path (as the e2e fixtures and examples/rl_step.py do) with its parts loaded beside it.

Nothing here starts vLLM: every call uses an empty cache directory and a port nobody listens on,
where `status` and `stop` only look."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tito_agents.sinks.harness import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_server.py"
PUBLIC = ("prepare", "start", "stop", "status", "describe", "is_ready", "base_url", "port")


def load() -> ModuleType:
    """The script imported by file path under a name of this test's own."""
    name = "tito_vllm_server_unit"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture
def quiet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty cache directory and a free port, for this process and for subprocesses."""
    env = {"TITO_CACHE_DIR": str(tmp_path / "cache"), "TITO_VLLM_PORT": str(free_port())}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_command_line_works_from_another_directory(
    tmp_path: Path, quiet_env: dict[str, str]
) -> None:
    helped = run("--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "{prepare,start,stop,status,url}" in helped.stdout
    for command in ("prepare", "start", "stop", "status", "url"):
        assert run(command, "--help", cwd=tmp_path).returncode == 0
    port = quiet_env["TITO_VLLM_PORT"]
    url = run("url", cwd=tmp_path)
    assert url.returncode == 0 and url.stdout.strip() == f"http://127.0.0.1:{port}/v1"
    status = run("status", cwd=tmp_path)
    assert status.returncode == 1 and status.stdout.strip() == f"not running (port {port})"
    stopped = run("stop", cwd=tmp_path)
    assert stopped.returncode == 0 and "no vLLM started by this script" in stopped.stderr


def test_a_bad_port_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_VLLM_PORT", "not-a-port")
    result = run("start", cwd=tmp_path)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "[vllm_server] ERROR: TITO_VLLM_PORT='not-a-port' is not an integer"
    )


def test_imported_by_path_it_offers_the_public_functions(quiet_env: dict[str, str]) -> None:
    mod = load()
    for name in (*PUBLIC, "model_dir", "is_prepared", "VllmServerError", "DEFAULT_START_TIMEOUT"):
        assert hasattr(mod, name), name
    assert str(SCRIPT.parent) not in sys.path  # the parts are loaded without touching sys.path
    port = int(quiet_env["TITO_VLLM_PORT"])
    assert mod.port() == port and mod.base_url() == f"http://127.0.0.1:{port}/v1"
    assert mod.model_dir() == Path(quiet_env["TITO_CACHE_DIR"]) / "models" / mod.SERVED_MODEL_NAME
    assert not mod.is_prepared() and not mod.is_ready()
    assert mod.stop() is False  # nothing of ours on that port: nothing stopped
    assert "not started by this script" in mod.describe()
    assert mod.server_command(port)[mod.server_command(port).index("--port") + 1] == str(port)


def test_the_error_callers_catch_is_the_one_the_parts_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = load()
    monkeypatch.setenv("TITO_VLLM_PORT", "70000")
    with pytest.raises(mod.VllmServerError, match="out of range"):
        mod.start(timeout=1)
