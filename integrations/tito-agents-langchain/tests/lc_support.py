"""Shared pieces of the integration tests: the fake's responder, a ReAct-style LangGraph agent and
content checks. (Tests import helpers from here, never from conftest: another integration's
conftest may hold that module name in the same session.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from tito_agents.testing.fake_vllm import RequestView, handoff_responder

WEATHER = {"Paris": "18C and sunny", "Tokyo": "22C and cloudy", "Oslo": "3C and snowing"}


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return WEATHER.get(city.strip().title(), "unknown")


def react_graph(model: BaseChatModel, *, sync_node: bool = False) -> CompiledStateGraph[Any]:
    """agent -> tools -> agent -> end: the classic LangGraph ReAct loop (the fake calls the tool
    once, then answers from its result)."""
    bound = model.bind_tools([get_weather])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    def agent_sync(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent_sync if sync_node else agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


STRUCTURED_REPLY = {"name": "Paris", "population": 2100000}

MakeModel = Callable[..., ChatOpenAI]
"""The `make_model` fixture: ChatOpenAI(**overrides) on the fake, closed after the test."""


def responder(view: RequestView) -> str:
    """The fake model that takes handoffs (the default one where no handoff or named tool is
    offered), plus a JSON object when a `response_format` is requested."""
    if view.body.get("response_format"):
        return json.dumps(STRUCTURED_REPLY)
    return handoff_responder(view)


def decode(tokenizer: Any, ids: Any) -> str:
    """The text of an id array (special tokens dropped)."""
    return str(tokenizer.decode(ids.tolist(), skip_special_tokens=True))


def ai_messages(result: dict[str, Any]) -> list[AIMessage]:
    return [m for m in result["messages"] if isinstance(m, AIMessage)]
