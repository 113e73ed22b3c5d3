"""The attribution resolver: when a captured request is sent, read LangChain's own context and name
the request's episode (its root run's), agent (`_agents.agent_path`) and labels (run ids, step).

It runs inside the capture transport, in the caller's context, so it sees:

* `var_child_runnable_config`: the config of the innermost running runnable (a LangGraph node, a
  chain step, a tool): metadata (`langgraph_node`, `langgraph_step`, `langgraph_checkpoint_ns`,
  `thread_id`) and a callbacks manager whose `parent_run_id` is the enclosing run;
* the model-run slot set by the marker of a wrapped model (`_scopes.MODEL_RUN`): the exact chat
  model run, also for a model invoked on its own, outside any runnable.

The episode comes from the `TitoCallbackHandler` that saw the run start; explicit
`collector.episode()` / `tito_agents.agent()` scopes still win (the core merges them first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from uuid import UUID

from langchain_core.runnables.config import var_child_runnable_config

import tito_agents as tito
from tito_agents.integration import Attribution, register_resolver
from tito_agents.samples import ROLE_LABEL, SUMMARIZER_ROLE
from tito_agents_langchain._agents import PATH_SEPARATOR, agent_path
from tito_agents_langchain._messages import call_id_of
from tito_agents_langchain._scopes import (
    MODEL_RUN,
    AgentOfCall,
    ModelRun,
    RootScope,
    RunScopes,
    live_scopes,
)

LABEL_KEYS = (
    "langgraph_node",
    "langgraph_step",
    "langgraph_checkpoint_ns",
    "lc_agent_name",
    "thread_id",
    "lc_source",
)
"""Runnable metadata copied onto each call's labels (and so onto each sample's metadata)."""

SUMMARY_SOURCES = frozenset({"summarization"})
"""`lc_source` values of model calls that summarise an agent's history: `langchain.agents.
middleware.SummarizationMiddleware` invokes its model with `metadata={"lc_source":
"summarization"}`. Such a call gets the label `role="summarizer"` (`tito_agents.SUMMARIZER_ROLE`),
so its merged sample is a segment of the agent's trajectory marked as the summary."""


def node_agent(metadata: Mapping[str, Any]) -> str | None:
    """The LangGraph node making the call (None outside a graph): the agent label before agents
    were named, e.g. `TitoCallbackHandler(collector, agent_from=node_agent)` for per-node labels."""
    node = metadata.get("langgraph_node")
    return node if isinstance(node, str) else None


def resolve() -> Attribution | None:
    """Episode, agent and labels of a request sent now from LangChain code; None elsewhere."""
    config = var_child_runnable_config.get()
    run = MODEL_RUN.get()
    if run is not None and not run.live:
        run = None
    if config is None and run is None:
        return None
    manager = config.get("callbacks") if config is not None else None
    parent: UUID | None = getattr(manager, "parent_run_id", None)
    scope = None
    if run is not None:
        scope = _scope_in((ref() for ref in live_scopes()), run.run_id)
    if scope is None and parent is not None:
        scope = _scope_in(getattr(manager, "handlers", ()), parent)
    metadata: Mapping[str, Any] = (
        (config.get("metadata") or {}) if config is not None else run.metadata  # type: ignore[union-attr]
    )
    if run is not None and config is not None:
        # A model invoked with metadata of its own (SummarizationMiddleware's
        # `{"lc_source": "summarization"}`) runs under a config whose metadata replaced its
        # node's; the run's own metadata still holds the inherited LangGraph keys beneath it.
        metadata = {**run.metadata, **metadata}
    if run is not None:
        _check_setup(run, scope)
    if scope is not None:
        named = scope.handler.agent_for(metadata, scope)
    else:
        path = agent_path(metadata)
        named = AgentOfCall(path[-1] if path else None, path)
    labels = _labels(metadata, run, parent, scope)
    if named.path:
        labels["agent_path"] = PATH_SEPARATOR.join(named.path)
    return Attribution(
        episode=scope.episode if scope is not None else None, agent=named.agent, labels=labels
    )


def current_episode() -> tito.Episode | None:
    """The episode the calling code runs in: an explicit `collector.episode()` scope, else the
    episode `TitoCallbackHandler` opened for the LangChain run (graph, node, chain) around it.

    Call it from a node or tool, e.g. to give a step its own reward."""
    explicit = tito.current_episode()
    if explicit is not None:
        return explicit
    found = resolve()
    return found.episode if found is not None else None


def install() -> None:
    """Register the resolver with tito-agents (idempotent)."""
    register_resolver(resolve)


def _scope_in(candidates: Iterable[object], run_id: UUID) -> RootScope | None:
    for handler in candidates:
        if isinstance(handler, RunScopes):
            scope = handler.scope_of(run_id)
            if scope is not None:
                return scope
    return None


def _labels(
    metadata: Mapping[str, Any], run: ModelRun | None, parent: UUID | None, scope: RootScope | None
) -> dict[str, Any]:
    labels: dict[str, Any] = {}
    for key in LABEL_KEYS:
        value = metadata.get(key)
        if value is not None:
            labels[key] = value if isinstance(value, str | int | float | bool) else str(value)
    if labels.get("lc_source") in SUMMARY_SOURCES:
        labels[ROLE_LABEL] = SUMMARIZER_ROLE
    if run is not None:
        labels["lc_run_id"] = str(run.run_id)
        parent = run.parent_run_id
    if parent is not None:
        labels["lc_parent_run_id"] = str(parent)
    if scope is not None:
        labels["lc_root_run_id"] = str(scope.run_id)
    return labels


def _check_setup(run: ModelRun, scope: RootScope | None) -> None:
    """Warn (once per wrapped model) about set-ups that lose calls or split them."""
    marker = run.marker
    if scope is None and tito.current_episode() is None:
        marker.warn_once(
            "no-episode",
            "a model wrapped by tito_agents_langchain.wrap() made a call outside any episode: "
            "add TitoCallbackHandler(collector) to the run's callbacks "
            '(config={"callbacks": [handler]}) or run it inside `with collector.episode(...)`. '
            f"The call goes where the collector's outside_episode policy "
            f"({marker.collector.settings.outside_episode.value!r}) sends it.",
        )
    elif scope is not None and scope.handler.collector is not marker.collector:
        marker.warn_once(
            "collector",
            "the model was wrapped with a different Collector than the TitoCallbackHandler's: "
            "its calls join the handler's episodes but are counted by the other collector; pass "
            "the same collector to wrap() and TitoCallbackHandler().",
        )


def set_step_reward(reward: float | None, message: Any = None) -> None:
    """Reward one step from inside a node or tool: the call that produced `message` (an
    `AIMessage` carrying `response_metadata["tito"]`), else the episode's latest call.

    In per-call samples a call's own reward replaces the episode's; merged samples add them up.
    Raises `ConfigurationError` outside any episode, `KeyError` for an unknown call."""
    episode = current_episode()
    if episode is None:
        raise tito.ConfigurationError(
            "set_step_reward() found no episode here: call it from a node or tool of a run that "
            "has TitoCallbackHandler in its callbacks, or inside `with collector.episode(...)`"
        )
    if message is not None:
        call_id = call_id_of(message)
        if call_id is None:
            raise KeyError(
                "the message carries no captured call id (it did not come from a wrapped model "
                "under TitoCallbackHandler, or attach_ids is off)"
            )
        episode.set_call_reward(call_id, reward)
        return
    call = episode.last_call
    if call is None:
        raise KeyError(f"episode {episode.episode_id!r} has no captured call yet")
    episode.set_call_reward(call, reward)
