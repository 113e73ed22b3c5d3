"""Fixtures: one fake vLLM over HTTP per session, and a collector with LiteLLM capture installed
(and uninstalled after) for each test.

LiteLLM fetches its model cost map from the network at import unless told to read its local copy;
offline that costs seconds of retries, so the variable is set before anything imports litellm.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import tito_agents_litellm
from litellm_support import host_of

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

_HERE = Path(__file__).parent

_LITELLM_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed event loop:ResourceWarning"),
]
"""What LiteLLM itself warns of, with or without tito: pydantic, whenever LiteLLM builds its
response types, says their ReadOnly TypedDict items are not enforced; and LiteLLM drops sockets
and event loops unclosed (its thread-pool logging runs event loops of its own; plain
`litellm.completion` calls from threads leak a socket now and then, install or not)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            for mark in _LITELLM_WARNINGS:
                item.add_marker(mark)


@pytest.fixture(scope="session")
def vllm() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as server:
        yield server


@pytest.fixture
def collector() -> Iterator[tito.Collector]:
    collector = tito.Collector()
    yield collector
    collector.close()


@pytest.fixture
def capture(
    vllm: FakeVLLMServer, collector: tito.Collector
) -> Iterator[tito_agents_litellm.LiteLLMCapture]:
    with tito_agents_litellm.install(collector, vllm_hosts=[host_of(vllm)]) as installed:
        yield installed
    vllm.faults.status_before_body = None


@pytest.fixture(autouse=True)
def litellm_leftovers() -> Iterator[None]:
    """LiteLLM leaves event loops and sockets of its own unclosed (its background logging, the
    aiohttp sessions of clients bound to a test's finished loop); collected here, where they are
    known to be LiteLLM's, instead of failing whichever test the garbage collector next runs in."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
