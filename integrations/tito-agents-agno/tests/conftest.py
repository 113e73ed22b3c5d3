"""Fixtures: one fake vLLM per session, and the agent-name hooks installed for each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tito_agents_agno

from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer


@pytest.fixture(scope="session")
def agno_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as server:
        yield server


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    tito_agents_agno.install()
    yield
    tito_agents_agno.uninstall()
