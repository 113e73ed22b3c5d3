"""Fixtures: one fake vLLM per session that plays ADK's agents, and the agent-name hook installed
for each test. The tests need google-adk, whose pins clash with the development environment's
(watchdog): they run in an environment of their own (the package's `test` extra)."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported

import dataclasses
import gc
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import tito_agents_google_adk

from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeVLLMServer,
    RequestView,
    default_responder,
    hermes_tool_call,
)

_HERE = Path(__file__).parent
TRANSFER = "transfer_to_agent"

_LITELLM_WARNINGS = [
    pytest.mark.filterwarnings("ignore:Items? .* the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore:unclosed <socket:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:unclosed event loop:ResourceWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_.*' attribute on the instance"),
]
"""What LiteLLM itself warns of, with or without tito (see the LiteLLM integration's tests; and
pydantic, when LiteLLM reads a streamed chunk's computed fields for ADK)."""

_ADK_WARNINGS = [
    pytest.mark.filterwarnings("ignore:The `plugins` argument is deprecated:DeprecationWarning"),
]
"""What ADK itself warns of: its `AgentTool` builds its runner with a deprecated argument."""


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function") or {}


def _sub_agent(transfer: Mapping[str, Any], view: RequestView) -> str:
    """The agent to transfer to: the first of the tool's choices the conversation names."""
    schema = _function(transfer).get("parameters") or {}
    choices = (schema.get("properties") or {}).get("agent_name", {}).get("enum") or []
    text = str(view.messages)
    return next((c for c in choices if c in text), choices[0] if choices else "")


def adk_responder(view: RequestView) -> str:
    """An ADK agent's turn: after a tool result, an answer; else its first own tool, once; else
    (a coordinator) a transfer to the sub-agent the user named; else an answer."""
    if not view.messages or view.messages[-1].get("role") == "tool":
        return default_responder(dataclasses.replace(view, tools=()))
    tools = {str(_function(t).get("name")): t for t in view.tools}
    own = [name for name in tools if name != TRANSFER]
    if own:
        choice = {"type": "function", "function": {"name": own[0]}}
        return default_responder(dataclasses.replace(view, tool_choice=choice))
    if TRANSFER in tools:
        return hermes_tool_call(TRANSFER, {"agent_name": _sub_agent(tools[TRANSFER], view)})
    return default_responder(view)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            for mark in [*_LITELLM_WARNINGS, *_ADK_WARNINGS]:
                item.add_marker(mark)


@pytest.fixture(scope="session")
def adk_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=adk_responder)) as server:
        yield server


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    tito_agents_google_adk.install()
    yield
    tito_agents_google_adk.uninstall()
    with warnings.catch_warnings():  # LiteLLM's own leftovers, collected where they are known
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
