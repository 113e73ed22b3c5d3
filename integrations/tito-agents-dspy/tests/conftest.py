"""Fixtures: one fake vLLM per session that answers in DSPy's chat format, LiteLLM capture on a
collector for each test, and the agent-name resolver installed.

LiteLLM fetches its model cost map from the network at import unless told to read its local copy;
offline that costs seconds of retries, so the variable is set before anything imports litellm.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import gc
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import tito_agents_dspy
import tito_agents_litellm

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
from tito_agents.testing.fake_vllm._model import RequestView

_HERE = Path(__file__).parent

_LITELLM_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed event loop:ResourceWarning"),
]
"""What LiteLLM itself warns of, with or without tito (see the LiteLLM integration's tests)."""

_FIELD = re.compile(r"`\[\[ ## (\w+) ## \]\]`")


def dspy_responder(view: RequestView) -> str:
    """DSPy's ChatAdapter answer: each output field its last message asks for, in order, then
    the completed marker; each field's text names the question's first word (the episode's
    marker)."""
    last = str(view.messages[-1].get("content", "")) if view.messages else ""
    fields = [f for f in _FIELD.findall(last) if f != "completed"]
    marker = re.search(r"\[\[ ## question ## \]\]\n(\S+)", last)
    about = marker.group(1) if marker else "it"
    body = "".join(f"[[ ## {field} ## ]]\n{field} on {about}\n\n" for field in fields)
    return body + "[[ ## completed ## ]]"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            for mark in _LITELLM_WARNINGS:
                item.add_marker(mark)


@pytest.fixture(scope="session")
def dspy_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=dspy_responder)) as server:
        yield server


@pytest.fixture
def collector(dspy_server: FakeVLLMServer) -> Iterator[tito.Collector]:
    """A collector whose LiteLLM calls to the fake vLLM are captured."""
    host = urlsplit(dspy_server.base_url).netloc
    with tito.Collector() as collector, tito_agents_litellm.install(collector, vllm_hosts=[host]):
        yield collector


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    tito_agents_dspy.install()
    yield
    tito_agents_dspy.uninstall()
    with warnings.catch_warnings():  # LiteLLM's own leftovers, collected where they are known
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
