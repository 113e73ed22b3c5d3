"""Which agent made a call in a LangGraph graph, and the chain of agents around it (`agent_path`).

LangGraph nests graphs: a node of one graph may run another graph (a subgraph), whose nodes may run
further graphs. Each running node carries `langgraph_checkpoint_ns` in its metadata, one segment per
nesting level, outermost first: `research_team:<task>|math_expert:<task>|model:<task>`. Agents built
with `langchain.agents.create_agent(..., name=...)` also carry their name as `lc_agent_name` in the
metadata of every node of their graph (nested plain subgraphs inherit it).

The agents around a call, level by level (graph G0 is the root, node n_i of graph G_i runs G_i+1,
node n_k of G_k makes the call):

* a graph with an `lc_agent_name` is that agent; its nodes are its internals (the `model` node, the
  `tools` node that may run other agents as tools);
* in a graph without one, the node leading to the call is the agent when it runs a subgraph (the
  supervisor's and swarm's agent nodes, the teams of a hierarchy); the node that makes the call
  itself is the agent only when no level above named one (a plain graph: its node is the agent).

A `create_agent` middleware hook node (`SummarizationMiddleware.before_model`) counts as the
agent's `model` node: the model calls middleware makes (summaries) belong to the agent. Consecutive
repeats collapse. So `create_supervisor` gives `supervisor` and `math_expert`, a swarm
`Alice` and `Bob`, nested teams `research_team>math_expert`, an agent run as a tool of a
`create_agent` supervisor `supervisor>math_expert`, and a plain ReAct graph its node, `agent`.

The names of outer graphs (`lc_agent_name` of G_i, i < k) are not in the call's own metadata (the
inner graph overrides it), so `TitoCallbackHandler` records them from the metadata of the task runs
(tagged `graph:step:N`) it sees start, per namespace, first seen wins: the same bookkeeping
LangGraph's own stream transformers use to detect subagents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

NS_SEP = "|"
"""LangGraph's separator of checkpoint namespace levels (node names may not contain it)."""
NS_END = ":"
"""LangGraph's separator of node name and task id in a namespace segment."""
PATH_SEPARATOR = ">"
"""Joins agent names in the `agent_path` label, as the Agents SDK integration does."""
TASK_TAG = "graph:step:"
"""The tag prefix LangGraph gives the run of each task (node execution) of a graph."""


MODEL_NODE = "model"
"""The node of a `create_agent` graph that calls its model."""
_MIDDLEWARE_NODE = re.compile(r"^[^.|:]+\.(before|after)_(model|agent)$")
"""A `create_agent` middleware hook node (`SummarizationMiddleware.before_model`, ...)."""


def node_name(node: str | None) -> str | None:
    """A graph node as an agent name: a `create_agent` middleware hook node counts as the agent's
    model node, so a call its middleware makes (a summary) joins the agent's trajectory."""
    if node is not None and _MIDDLEWARE_NODE.match(node):
        return MODEL_NODE
    return node


def graph_namespace(metadata: Mapping[str, Any]) -> str | None:
    """The checkpoint namespace of the graph a task run belongs to (its own namespace less its last
    segment; "" for the root graph), or None when `metadata` is not a LangGraph task's."""
    ns = metadata.get("langgraph_checkpoint_ns")
    if not isinstance(ns, str) or not ns:
        return None
    head, _, _ = ns.rpartition(NS_SEP)
    return head


def agent_path(
    metadata: Mapping[str, Any], graph_agents: Mapping[str, str | None] | None = None
) -> tuple[str, ...]:
    """The agents around a request made under runnable `metadata`, outermost first (see the module
    docstring); the last one made the call. Empty outside any LangGraph node and agent.

    graph_agents: the `lc_agent_name` of each outer graph, by graph namespace (what the handler
    recorded); levels missing there count as unnamed.
    """
    own = _text(metadata.get("lc_agent_name"))
    ns = metadata.get("langgraph_checkpoint_ns")
    segments = ns.split(NS_SEP) if isinstance(ns, str) and ns else []
    if not segments:
        node = node_name(_text(metadata.get("langgraph_node")))
        return tuple(name for name in (own or node,) if name)
    known = graph_agents or {}
    path: list[str] = []
    last = len(segments) - 1
    for level, segment in enumerate(segments):
        graph_ns = NS_SEP.join(segments[:level])
        named = own if level == last else known.get(graph_ns)
        node = node_name(segment.split(NS_END, 1)[0])
        name = named or (node if level < last or not path else None)
        if name and (not path or path[-1] != name):
            path.append(name)
    return tuple(path)


def path_agent(metadata: Mapping[str, Any]) -> str | None:
    """The agent of a request from its own metadata alone: the last of `agent_path(metadata)`.

    (`TitoCallbackHandler` uses the full rule, with the names of outer graphs it recorded; pass
    `agent_from=...` to it to label calls otherwise.)"""
    path = agent_path(metadata)
    return path[-1] if path else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
