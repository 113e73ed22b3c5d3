"""`agent_path`: the agents around a call, from LangGraph's metadata (pure, no graph run)."""

from __future__ import annotations

from typing import Any

import pytest
from tito_agents_langchain import agent_path


def meta(ns: str, lc: str | None = None) -> dict[str, Any]:
    node = ns.rsplit("|", 1)[-1].split(":", 1)[0]
    found: dict[str, Any] = {"langgraph_checkpoint_ns": ns, "langgraph_node": node}
    if lc is not None:
        found["lc_agent_name"] = lc
    return found


@pytest.mark.parametrize(
    ("metadata", "outer", "path"),
    [
        (meta("agent:1"), {}, ("agent",)),  # a plain graph: its node
        (meta("model:1", "weather"), {}, ("weather",)),  # create_agent as the graph
        (meta("SummarizationMiddleware.before_model:1"), {}, ("model",)),  # its middleware
        (meta("SummarizationMiddleware.before_model:1", "weather"), {}, ("weather",)),
        ({"langgraph_node": "Trim.after_model"}, {}, ("model",)),
        (meta("supervisor:1|agent:2"), {}, ("supervisor",)),  # create_react_agent subgraph node
        (meta("math:1|model:2", "math"), {"": None}, ("math",)),  # an agent node
        (meta("tools:1|model:2", "math"), {"": "sup"}, ("sup", "math")),  # agent run as a tool
        (meta("tools:1|model:2", "math"), {}, ("tools", "math")),  # outer name unknown
        (meta("team:1|lead:2|agent:3"), {}, ("team", "lead")),  # nested teams
        (meta("tools:1|draft:2", "sup"), {"": "sup"}, ("sup",)),  # a plain subgraph of an agent
        ({"lc_agent_name": "solo"}, {}, ("solo",)),  # no namespace
        ({}, {}, ()),  # outside LangGraph
    ],
)
def test_agent_path(
    metadata: dict[str, Any], outer: dict[str, str | None], path: tuple[str, ...]
) -> None:
    assert agent_path(metadata, outer) == path
