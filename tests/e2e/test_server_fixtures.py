"""The e2e tier's own machinery (tests/e2e/conftest.py), checked without a server: one server per
configuration, a free port for each extra one, and the per-test alarm paused while a server starts
and re-armed with what was left of it."""

from __future__ import annotations

import signal
import socket

import pytest

from tests.support.e2e_servers import STANDARD, ServerConfig, paused_alarm
from tito_agents.sinks.harness import free_port

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX interval timers")


def test_the_alarm_is_paused_during_a_start_and_rearmed_with_what_was_left() -> None:
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    saved, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1000.0)
        with paused_alarm():
            assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0  # no alarm during the start
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0.0 < remaining <= 1000.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, saved)
        signal.signal(signal.SIGALRM, previous)


def test_no_alarm_stays_no_alarm() -> None:
    saved, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        with paused_alarm():
            pass
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, saved)


def test_equal_configurations_are_one_server_and_set_their_own_flags() -> None:
    servers = {ServerConfig(), STANDARD, ServerConfig(extra_args="--reasoning-parser qwen3")}
    assert len(servers) == 2
    weights = ServerConfig(model_dir="/tmp/policy-1")
    assert weights.env(9001) == {
        "TITO_VLLM_PORT": "9001",
        "TITO_VLLM_EXTRA_ARGS": "",
        "TITO_VLLM_MODEL_DIR": "/tmp/policy-1",
    }
    assert "TITO_VLLM_MODEL_DIR" not in STANDARD.env(9001)


def test_a_free_port_can_be_listened_on() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
