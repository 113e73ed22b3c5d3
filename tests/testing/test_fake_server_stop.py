"""Stopping the fake vLLM server with keep-alive connections still open is quiet.

Python 3.11's asyncio streams log "Exception in callback ... CancelledError" with a traceback for
each connection handler cancelled at shutdown, unless the handler ends normally.
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import subprocess
import sys

import pytest

from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer


def test_stop_with_open_keep_alive_connections_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncio")
    server = FakeVLLMServer(FakeConfig()).start()
    connections = []
    for _ in range(3):
        conn = socket.create_connection((server.host, server.port), timeout=30)
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")  # served; the handler now waits
        connections.append(conn)
    server.stop()
    for conn in connections:
        assert conn.recv(4096) == b""  # closed by the server
        conn.close()
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]
    assert server.stats.connections == 3


def test_stop_right_after_clients_close_or_connect_leaves_no_task_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CI caught "Task was destroyed but it is pending!" on stderr: a client had just closed its
    connection, the handler was awaiting the close, and the loop closed under it. Every round stops
    the server with handlers in each state — one awaiting its close, one idle on keep-alive, one
    accepted without a request — and a collected pending task would log that error."""
    caplog.set_level(logging.DEBUG, logger="asyncio")
    for _ in range(30):
        server = FakeVLLMServer(FakeConfig()).start()
        served = []
        for _ in range(2):
            conn = socket.create_connection((server.host, server.port), timeout=30)
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
            served.append(conn)
        served[0].close()  # its handler now reads EOF and awaits the close
        silent = socket.create_connection((server.host, server.port), timeout=30)
        server.stop()
        served[1].close()
        silent.close()
        gc.collect()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, errors


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_standalone_server_stops_cleanly_on_a_signal_even_started_in_the_background(
    signum: signal.Signals,
) -> None:
    """`python -m tito_agents.testing.fake_vllm` exits 0, silently, on SIGINT or SIGTERM, also when
    started as a shell's background job (SIGINT ignored at start: Python then installs no
    KeyboardInterrupt handler, so a server waiting for one would keep running and hang CI's
    install tier)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tito_agents.testing.fake_vllm", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert server.stdout is not None
        assert " serving at " in server.stdout.readline()
        server.send_signal(signum)
        _, stderr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0 and stderr == "", stderr
