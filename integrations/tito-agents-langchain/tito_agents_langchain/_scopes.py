"""What a captured request needs to know about LangChain: the chat model run making it, and the
episode (root run) it belongs to.

Two facts are published here, both read by the resolver when the request is sent:

* the *model-run slot*: `ModelRunMarker`, the callback `wrap()` adds to a model, sets it in
  `on_chat_model_start`, which LangChain runs inline in the caller's context just before the HTTP
  request, so the request sees the exact chat model run. The slot cannot be reset (`on_llm_end`
  runs in another context), so it carries a liveness check instead: once the run ends, the slot is
  dead and ignored.
* `RunScopes`: the base of callbacks (`TitoCallbackHandler`) that map any run id of a run tree to
  the `RootScope` (episode) of its root run.
"""

from __future__ import annotations

import contextvars
import threading
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

if TYPE_CHECKING:
    from tito_agents import Collector, Episode

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class CaptureWarning(UserWarning):
    """Capture is set up in a way that loses calls (a model not wrapped, a run outside episodes)."""


@dataclass(frozen=True, slots=True)
class ModelRun:
    """The chat model run in progress in the current context, as its marker saw it start."""

    run_id: UUID
    parent_run_id: UUID | None
    metadata: Mapping[str, Any]
    marker: ModelRunMarker

    @property
    def live(self) -> bool:
        """False once the run has ended: a stale slot left in the context names no request."""
        return self.run_id in self.marker.live_runs


MODEL_RUN: contextvars.ContextVar[ModelRun | None] = contextvars.ContextVar(
    "tito_langchain_model_run", default=None
)


class WarnOnce:
    """Issue each kind of warning once per owner: loud enough to notice, never a flood."""

    def __init__(self) -> None:
        self._issued: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, key: str, message: str) -> None:
        with self._lock:
            if key in self._issued:
                return
            self._issued.add(key)
        warnings.warn(message, CaptureWarning, stacklevel=3)


class ModelRunMarker(BaseCallbackHandler):
    """Added to a wrapped model's own callbacks: names each chat model run for the requests it
    makes. Inline and cheap: one contextvar set and one set update per run, nothing per token."""

    run_inline = True
    raise_error = False

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.live_runs: set[UUID] = set()
        self.warn_once = WarnOnce()

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
        self.live_runs.add(run_id)
        MODEL_RUN.set(ModelRun(run_id, parent_run_id, metadata or _EMPTY, self))

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        self.live_runs.discard(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.live_runs.discard(run_id)


@dataclass(frozen=True, slots=True)
class AgentOfCall:
    """The agent label of a call and the chain of agents around it, outermost first."""

    agent: str | None
    path: tuple[str, ...]


@dataclass(slots=True, eq=False)
class RootScope:
    """One root run and its episode. `owned`: the handler opened the episode and ends it; False
    when the run started inside the user's own `collector.episode(...)`, which it then joins."""

    run_id: UUID
    episode: Episode
    owned: bool
    handler: RunScopes
    runs: list[UUID] = field(default_factory=list)
    graph_agents: dict[str, str | None] = field(default_factory=dict)
    """The `lc_agent_name` of each graph run under this root, by checkpoint namespace (first seen
    wins; None for an unnamed graph): names the outer agents of a call (`_agents.agent_path`)."""


class RunScopes(BaseCallbackHandler):
    """Base of callbacks that know the root scope of every run they saw start."""

    collector: Collector

    def scope_of(self, run_id: UUID) -> RootScope | None:
        """The root scope of `run_id`, or None if this callback never saw that run start."""
        raise NotImplementedError

    def agent_for(self, metadata: Mapping[str, Any], scope: RootScope) -> AgentOfCall:
        """The agent of a request made under runnable metadata `metadata` in `scope`, and the
        chain of agents around it."""
        raise NotImplementedError


_live_lock = threading.Lock()
_live: tuple[weakref.ref[RunScopes], ...] = ()


def add_live(scopes: RunScopes) -> None:
    """Register a callback for requests that only know their model run (no runnable config)."""
    global _live
    with _live_lock:
        _live = (*(r for r in _live if r() is not None), weakref.ref(scopes))


def live_scopes() -> tuple[weakref.ref[RunScopes], ...]:
    """The registered callbacks, as weak references (a snapshot: safe to iterate anywhere)."""
    return _live
