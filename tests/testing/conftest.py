"""Fixtures for the fake vLLM tests: one SmolLM2 tokenizer and one default fake per session."""

from __future__ import annotations

from typing import Any

import pytest

from tito_agents.testing import FakeVLLM, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer()


@pytest.fixture(scope="session")
def fake(tokenizer: Any) -> FakeVLLM:
    """The default fake (SmolLM2-135M-Instruct, canonical tokenization); do not change its faults."""
    return FakeVLLM()
