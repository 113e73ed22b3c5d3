"""`TitoCallbackHandler`: one callback that turns each root LangChain / LangGraph run into an episode.

A run without a parent this handler knows (the graph, chain or model the user invoked) opens an
episode; every run under it maps to that root; when the root run ends, the episode ends and its
samples go to the collector's sink. Calls are attributed when they are sent, by the resolver
(`_attribution`), from the run tree this handler records, never from contextvars set in callbacks.

Callback semantics respected: the handler is synchronous and inline (`run_inline = True`), so
LangChain neither hops to a thread pool per event nor copies contexts for it; `raise_error = False`,
so nothing it does can fail the user's run; and it implements no per-token method.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.documents import Document
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

import tito_agents as tito
from tito_agents_langchain import _attribution
from tito_agents_langchain._agents import TASK_TAG, agent_path, graph_namespace
from tito_agents_langchain._messages import attach, calls_of_run, episode_ids_in, response_id_of
from tito_agents_langchain._scopes import AgentOfCall, RootScope, RunScopes, WarnOnce, add_live

logger = logging.getLogger("tito_agents.langchain")

RewardFn = Callable[[Any], float | None]
AgentFn = Callable[[Mapping[str, Any]], str | None]


class TitoCallbackHandler(RunScopes):
    """Scopes one episode per root run; labels calls with their run, LangGraph node and step.

    Add it to an existing agent, chain or graph: `graph.ainvoke(x, config={"callbacks":
    [handler]})`, or `graph.with_config(callbacks=[handler])`. One handler serves any number of
    concurrent invocations. The root run's `metadata` may name the episode: `episode_id`,
    `task_id`, `group_id` (config={"metadata": {...}}); the episode id defaults to the root run id.
    A root run that starts inside the user's own `collector.episode(...)` joins that episode
    instead (the user's scope ends it).

    collector: the `tito_agents.Collector` the model was wrapped with (`wrap(llm, collector)`).
    reward_fn: computes the episode reward from the root run's outputs when it ends.
    await_reward: hold each ended episode until `set_reward(...)` (or `finish_pending()`) instead
        of writing its samples when its root run ends: for rewards computed after the graph returns.
    agent_from: overrides the agent label of a call, from its runnable metadata. By default the
        agent is the one that made the call (`create_agent` / `create_react_agent` name, the
        subgraph node running it, or the node of a plain graph; see `agent_path`), so supervisor,
        swarm and team graphs yield one trajectory per agent. Either way each call's labels carry
        `agent_path`, the chain of agents around it joined by ">" (`research_team>math_expert`).
    attach_ids: put `{"episode_id", "call_id"}` into each returned `AIMessage`'s
        `response_metadata["tito"]`; `attach_token_ids` adds `prompt_token_ids` and `token_ids`.

    A root run that raises writes no samples (as a failed `collector.episode()` body): a crashed
    rollout has no trustworthy reward. Errors while ending an episode (capture errors, a failing
    sink) never fail the user's run: they are logged and kept on `errors`.
    """

    run_inline = True
    raise_error = False

    def __init__(
        self,
        collector: tito.Collector,
        reward_fn: RewardFn | None = None,
        *,
        await_reward: bool = False,
        agent_from: AgentFn | None = None,
        attach_ids: bool = True,
        attach_token_ids: bool = False,
    ) -> None:
        self.collector = collector
        self.reward_fn = reward_fn
        self.await_reward = await_reward
        self.agent_from = agent_from
        self.attach_ids = attach_ids
        self.attach_token_ids = attach_token_ids
        self.last_episode: tito.Episode | None = None
        """The episode whose root run ended last (with concurrent runs, any of the recent ones)."""
        self.errors: deque[Exception] = deque(maxlen=100)
        """Recent errors raised while ending episodes (capture errors, sink errors)."""
        self._lock = threading.Lock()
        self._root_of: dict[UUID, UUID] = {}
        self._scopes: dict[UUID, RootScope] = {}
        self._pending: dict[str, tito.Episode] = {}
        self._pending_runs: dict[UUID, str] = {}
        self._warn_once = WarnOnce()
        add_live(self)
        _attribution.install()

    # ---- RunScopes ----

    def scope_of(self, run_id: UUID) -> RootScope | None:
        root = self._root_of.get(run_id)
        return self._scopes.get(root) if root is not None else None

    def agent_for(self, metadata: Mapping[str, Any], scope: RootScope) -> AgentOfCall:
        path = agent_path(metadata, scope.graph_agents)
        if self.agent_from is not None:
            return AgentOfCall(self.agent_from(metadata), path)
        return AgentOfCall(path[-1] if path else None, path)

    # ---- rewards and results ----

    def episode(self, target: Any) -> tito.Episode | None:
        """The episode of `target`: a root run id (UUID or str), an episode id, an `Episode`, or a
        graph result / message list / message carrying the ids `attach_ids` put on its messages.
        Running episodes and episodes awaiting their reward are found; written ones are not."""
        if isinstance(target, tito.Episode):
            return target
        with self._lock:
            for key in _keys(target):
                found = self._held(key)
                if found is not None:
                    return found
        return None

    def _held(self, key: UUID | str) -> tito.Episode | None:
        """A running or reward-awaiting episode by root run id or episode id (lock held)."""
        if isinstance(key, UUID):
            scope = self._scopes.get(key)
            if scope is not None:
                return scope.episode
            episode_id = self._pending_runs.get(key)
            return self._pending.get(episode_id) if episode_id is not None else None
        if key in self._pending:
            return self._pending[key]
        return next((s.episode for s in self._scopes.values() if s.episode.episode_id == key), None)

    def set_reward(self, target: Any, reward: float | None) -> tito.Episode:
        """Give an episode its reward (see `episode()` for `target`). An episode awaiting its reward
        (`await_reward=True`) is written now. Raises KeyError when no such episode is held."""
        episode = self.episode(target)
        if episode is None:
            raise KeyError(
                f"no running or reward-awaiting episode for {target!r}: without "
                "await_reward=True an episode is written when its root run ends (use reward_fn, "
                "or set rewards from inside the run with current_episode())"
            )
        episode.set_reward(reward)
        if self._take_pending(episode):
            self._write(episode, failed=False)
        return episode

    @property
    def pending_episodes(self) -> list[tito.Episode]:
        """Episodes whose root run ended and that await `set_reward` (with `await_reward=True`)."""
        with self._lock:
            return list(self._pending.values())

    def finish_pending(self) -> int:
        """Write every episode still awaiting its reward, with the rewards set so far. Returns how
        many were written."""
        with self._lock:
            episodes = list(self._pending.values())
            self._pending.clear()
            self._pending_runs.clear()
        for episode in episodes:
            self._write(episode, failed=False)
        return len(episodes)

    # ---- run tree ----

    def _start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: Any,
        tags: Sequence[str] | None = None,
    ) -> None:
        with self._lock:
            root = self._root_of.get(parent_run_id) if parent_run_id is not None else None
            if root is not None:
                self._root_of[run_id] = root
                scope = self._scopes[root]
                scope.runs.append(run_id)
                if tags and isinstance(metadata, Mapping):
                    _record_graph_agent(scope, metadata, tags)
                return
            self._scopes[run_id] = self._open(
                run_id, metadata if isinstance(metadata, Mapping) else {}
            )
            self._root_of[run_id] = run_id

    def _open(self, run_id: UUID, metadata: Mapping[str, Any]) -> RootScope:
        explicit = tito.current_episode()  # inline start events run in the caller's context
        if explicit is not None:
            return RootScope(run_id, explicit, owned=False, handler=self)
        episode = self.collector.episode(
            _text(metadata.get("episode_id")) or str(run_id),
            task_id=_text(metadata.get("task_id")),
            group_id=_text(metadata.get("group_id")),
        )
        return RootScope(run_id, episode, owned=True, handler=self)

    def _end(self, run_id: UUID, outputs: Any, error: BaseException | None) -> None:
        with self._lock:
            scope = self._scopes.pop(run_id, None)
            if scope is None:
                return
            for child in scope.runs:
                self._root_of.pop(child, None)
            self._root_of.pop(run_id, None)
        if scope.owned:
            self._end_episode(scope, outputs, failed=error is not None)

    def _end_episode(self, scope: RootScope, outputs: Any, *, failed: bool) -> None:
        episode = scope.episode
        self.last_episode = episode
        if not failed and self.reward_fn is not None:
            try:
                episode.set_reward(self.reward_fn(outputs))
            except Exception as exc:  # no trustworthy reward: like a crashed rollout
                logger.exception("reward_fn failed for episode %s", episode.episode_id)
                self.errors.append(exc)
                failed = True
        if not failed and self.await_reward:
            with self._lock:
                self._pending[episode.episode_id] = episode
                self._pending_runs[scope.run_id] = episode.episode_id
            return
        self._write(episode, failed=failed)

    def _take_pending(self, episode: tito.Episode) -> bool:
        with self._lock:
            if self._pending.get(episode.episode_id) is not episode:
                return False
            del self._pending[episode.episode_id]
            for run, episode_id in list(self._pending_runs.items()):
                if episode_id == episode.episode_id:
                    del self._pending_runs[run]
            return True

    def _write(self, episode: tito.Episode, *, failed: bool) -> None:
        try:
            episode.end(failed=failed)
        except Exception as exc:  # never fail the user's run from a callback
            logger.warning("episode %s: %s", episode.episode_id, exc)
            self.errors.append(exc)

    # ---- model runs ----

    def _model_end(self, run_id: UUID, response: LLMResult) -> None:
        scope = self.scope_of(run_id)
        if scope is None:
            return
        calls = calls_of_run(scope.episode, run_id, response_id_of(response))
        if not calls:
            self._warn_once(
                "not-captured",
                f"TitoCallbackHandler: chat model run {run_id} ended but none of its calls was "
                "captured. Wrap the model: llm = tito_agents_langchain.wrap(llm, collector). "
                "(Models not served by vLLM, and answers from a LangChain cache, are never "
                "captured.)",
            )
            return
        if self.attach_ids and response.generations:
            attach(response.generations[0], calls, scope.episode, token_ids=self.attach_token_ids)

    # ---- LangChain callbacks: starts ----

    def on_chain_start(
        self,
        serialized: dict[str, Any],
        inputs: dict[str, Any],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, metadata, tags)

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, metadata)

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, metadata)

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, metadata)

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self._start(run_id, parent_run_id, metadata)

    # ---- LangChain callbacks: ends ----

    def on_chain_end(self, outputs: dict[str, Any], *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, outputs, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None, error)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        self._model_end(run_id, response)
        self._end(run_id, response, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None, error)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, output, None)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None, error)

    def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._end(run_id, documents, None)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end(run_id, None, error)


def _record_graph_agent(scope: RootScope, metadata: Mapping[str, Any], tags: Sequence[str]) -> None:
    """Note the agent name of the graph a task run belongs to (first task seen wins)."""
    if not any(tag.startswith(TASK_TAG) for tag in tags):
        return
    graph_ns = graph_namespace(metadata)
    if graph_ns is not None and graph_ns not in scope.graph_agents:
        name = metadata.get("lc_agent_name")
        scope.graph_agents[graph_ns] = name if isinstance(name, str) and name else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _keys(target: Any) -> list[UUID | str]:
    """The lookup keys a `set_reward` / `episode` target stands for."""
    if isinstance(target, UUID):
        return [target]
    if isinstance(target, str):
        try:
            return [UUID(target), target]
        except ValueError:
            return [target]
    return list(episode_ids_in(target))
