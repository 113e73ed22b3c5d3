"""Fixtures: the agent-name hook installed for each test. llama-index-llms-openai pins openai < 3,
so these tests run in an environment of their own (see the README); elsewhere they are skipped,
saying so (test_llamaindex_agents.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    import tito_agents_llamaindex  # only where the framework is: make test-apart

    tito_agents_llamaindex.install()
    yield
    tito_agents_llamaindex.uninstall()
