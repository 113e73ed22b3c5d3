"""Fixtures: one fake vLLM per module, and the agent-name hook installed for each test. AutoGen
pins protobuf 5, so these tests run in an environment of their own (see the README); elsewhere
they are skipped, saying so (test_autogen_agents.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer


@pytest.fixture(scope="module")
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as fake:
        yield fake


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    import tito_agents_autogen  # only where the framework is: make test-apart

    tito_agents_autogen.install()
    yield
    tito_agents_autogen.uninstall()
