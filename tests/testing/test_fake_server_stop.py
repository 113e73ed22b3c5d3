"""Stopping the fake vLLM server with keep-alive connections still open is quiet.

Python 3.11's asyncio streams log "Exception in callback ... CancelledError" with a traceback for
each connection handler cancelled at shutdown, unless the handler ends normally.
"""

from __future__ import annotations

import logging
import socket

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
