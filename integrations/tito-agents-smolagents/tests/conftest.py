"""Fixtures: one fake vLLM per session that plays smolagents' tool-calling agents, and the
agent-name hooks installed for each test."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import tito_agents_smolagents

from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer, default_responder
from tito_agents.testing.fake_vllm._model import RequestView


def smolagents_responder(view: RequestView) -> str:
    """A smolagents `ToolCallingAgent`'s two steps: first its first tool other than
    `final_answer` (a managed agent is one), then `final_answer`; arguments from the task."""
    names = [str((t.get("function") or {}).get("name")) for t in view.tools]
    acted = any(m.get("role") != "system" and m.get("role") != "user" for m in view.messages)
    first = next((n for n in names if n != "final_answer"), "final_answer")
    wanted = "final_answer" if acted else first
    if wanted not in names:
        return default_responder(view)
    choice = {"type": "function", "function": {"name": wanted}}
    return default_responder(dataclasses.replace(view, tool_choice=choice))


@pytest.fixture(scope="session")
def smol_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=smolagents_responder)) as server:
        yield server


@pytest.fixture(autouse=True)
def installed() -> Iterator[None]:
    tito_agents_smolagents.install()
    yield
    tito_agents_smolagents.uninstall()
