"""The span map: which agent owns each open Agents SDK tracing span, and whether the model call
made inside a generation span was captured.

During a model call the SDK's current span (a contextvar) is the call's `generation` span; its
parent chain (turn, agent, function, ...) leads to the `AgentSpanData` of the agent that makes it.
Spans carry only their parent's id, so a `TracingProcessor` keeps the open spans: each new span
inherits its parent's owner, and an agent span owns itself. This labels handoff targets (a new
agent span) and agents run as tools (an agent span under the caller's function span) alike.

Threading: the SDK calls processors synchronously, from any thread. Writes take a lock; the
request-time lookup is a single dict read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from agents.tracing import (
    AgentSpanData,
    GenerationSpanData,
    ResponseSpanData,
    Span,
    Trace,
    TracingProcessor,
)

from tito_agents_openai_agents._stats import STATS, record_uncaptured

PATH_SEPARATOR = ">"


@dataclass(frozen=True, slots=True)
class AgentLabel:
    """The agent that owns a span: its name, the chain of agents that called it, its trace."""

    name: str
    path: str
    """Agent names from the outermost run to this agent, joined by ">" ("manager>translator" for
    an agent run as a tool of "manager"; a handoff target starts a new path)."""
    trace_id: str


@dataclass(slots=True)
class _OpenSpan:
    owner: AgentLabel | None
    trace_id: str
    model_call: str | None
    """"generation" (Chat Completions) or "response" (Responses API) for model-call spans."""
    captured: bool = False


def _model_call_kind(data: Any) -> str | None:
    if isinstance(data, GenerationSpanData):
        return "generation"
    if isinstance(data, ResponseSpanData):
        return "response"
    return None


class AgentSpanTracker(TracingProcessor):
    """A tracing processor that maps open spans to their agent; exports nothing.

    Register it once per process (`install` does). It keeps only open spans: an entry leaves when
    its span ends, and whatever a trace left behind leaves when the trace ends.
    """

    def __init__(self) -> None:
        self._spans: dict[str, _OpenSpan] = {}
        self._by_trace: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    # ---- request time ----

    def claim(self, span_id: str) -> AgentLabel | None:
        """The agent owning open span `span_id`, which made a captured request now (or None)."""
        info = self._spans.get(span_id)
        if info is None:
            return None
        info.captured = True
        return info.owner

    def is_tracked(self, span_id: str) -> bool:
        return span_id in self._spans

    @property
    def open_spans(self) -> int:
        """How many spans are open now (for leak checks)."""
        return len(self._spans)

    # ---- TracingProcessor ----

    def on_trace_start(self, trace: Trace) -> None:
        return None

    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            for span_id in self._by_trace.pop(trace.trace_id, ()):
                self._spans.pop(span_id, None)

    def on_span_start(self, span: Span[Any]) -> None:
        data = span.span_data
        parent_id = span.parent_id
        parent = self._spans.get(parent_id) if parent_id is not None else None
        owner = parent.owner if parent is not None else None
        if isinstance(data, AgentSpanData):
            path = data.name if owner is None else f"{owner.path}{PATH_SEPARATOR}{data.name}"
            owner = AgentLabel(data.name, path, span.trace_id)
        info = _OpenSpan(owner, span.trace_id, _model_call_kind(data))
        with self._lock:
            self._spans[span.span_id] = info
            self._by_trace.setdefault(span.trace_id, set()).add(span.span_id)

    def on_span_end(self, span: Span[Any]) -> None:
        with self._lock:
            info = self._spans.pop(span.span_id, None)
            siblings = self._by_trace.get(span.trace_id)
            if siblings is not None:
                siblings.discard(span.span_id)
        if info is None or info.model_call is None or span.error is not None:
            return  # not a model call, or a failed attempt (never a sample)
        agent = info.owner.name if info.owner is not None else None
        STATS.count_model_call()
        if not info.captured:
            record_uncaptured(agent, info.model_call)

    def shutdown(self) -> None:
        with self._lock:
            self._spans.clear()
            self._by_trace.clear()

    def force_flush(self) -> None:
        return None
