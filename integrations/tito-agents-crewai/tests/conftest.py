"""Fixtures: one fake vLLM per session that answers as a CrewAI agent, and the agent-name hook
installed for each test. The tests need crewai, whose pins clash with the development
environment's (openai, pydantic, httpx): they run in an environment of their own (the package's
`test` extra)."""

from __future__ import annotations

import os

# offline: no telemetry or traces sent (set before crewai is imported)
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import tito_agents_crewai

from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeVLLMServer,
    RequestView,
    hermes_tool_call,
)

with warnings.catch_warnings():  # crewai's own import warns (its lazy `crewai.rag` package)
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401

_HERE = Path(__file__).parent

_CREWAI_WARNINGS = [
    pytest.mark.filterwarnings("ignore:function_calling_llm is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:deprecated$:DeprecationWarning"),
]
"""What CrewAI itself warns of, with or without tito: it reads its own deprecated fields
(`function_calling_llm`, and others pydantic reports as just "deprecated") on every agent."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            for mark in _CREWAI_WARNINGS:
                item.add_marker(mark)


def crew_responder(view: RequestView) -> str:
    """A CrewAI agent's turn: a manager offered the delegation tool, before any tool result,
    delegates its task to the Researcher; otherwise a final answer (CrewAI's ReAct format)
    naming the task's first word."""
    task = str(view.messages[-1].get("content", "")) if view.messages else ""
    delegate = [n for n in _tool_names(view) if n == "delegate_work_to_coworker"]
    if delegate and view.messages[-1].get("role") != "tool":
        arguments = {"task": "Research it.", "context": task, "coworker": "Researcher"}
        return hermes_tool_call(delegate[0], arguments)
    return f"Thought: I now know the final answer\nFinal Answer: done: {task.split()[:1]}"


def _tool_names(view: RequestView) -> list[str]:
    return [str((t.get("function") or {}).get("name")) for t in view.tools]


@pytest.fixture(scope="session")
def crew_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=crew_responder)) as server:
        yield server


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    tito_agents_crewai.install()
    yield
    tito_agents_crewai.uninstall()
