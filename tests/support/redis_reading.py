"""Reading a Redis stream back in tests: wait for an event a test caused, drain a reader."""

from __future__ import annotations

import time
from collections.abc import Callable

from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.redis_streams import RedisStreamReader


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Wait for an event the test caused (the deadline only turns a hang into a failure)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.005)


def drain(reader: RedisStreamReader, expected: int, timeout: float = 20) -> list[Sample]:
    """Read and acknowledge until `expected` samples arrived (or time runs out)."""
    got: list[Sample] = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        try:
            batch = reader.read(50, timeout=0.2)
        except SinkError as exc:
            assert exc.retryable
            time.sleep(0.1)
            continue
        got += batch
        reader.ack(batch)
    return got
