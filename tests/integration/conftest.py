"""A fake vLLM 0.32 over real HTTP on loopback, shared by the integration tests of one session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(tokenization="drift")) as server:
        yield server
