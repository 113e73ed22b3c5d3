"""The SDK's own record of what ran, to check capture against: a tracing processor that keeps every
span, and the model calls it saw with the agent that made each (from the span tree alone)."""

from __future__ import annotations

import json
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

from tito_agents.calls import Call, Endpoint


@dataclass(frozen=True)
class TracedCall:
    """A model call as the SDK's tracing recorded it."""

    agent: str | None
    trace_id: str
    key: str
    """What joins it to a captured call (`call_key`): the response id (Responses API) or the
    messages sent, as JSON with sorted keys (Chat Completions, whose span keeps no id)."""
    input: Any
    """The input the SDK sent (messages, or Responses input items)."""


def messages_key(messages: Any) -> str:
    return json.dumps(messages, sort_keys=True, default=str)


def call_key(call: Call) -> str:
    """The `TracedCall.key` of a captured call."""
    if call.endpoint is Endpoint.RESPONSES:
        return call.request_id
    return messages_key(call.messages)


class SpanLog(TracingProcessor):
    """Keeps every span the SDK reports (register with `agents.add_trace_processor`)."""

    def __init__(self) -> None:
        self._spans: dict[str, Span[Any]] = {}
        self._lock = threading.Lock()

    def on_trace_start(self, trace: Trace) -> None:
        return None

    def on_trace_end(self, trace: Trace) -> None:
        return None

    def on_span_start(self, span: Span[Any]) -> None:
        with self._lock:
            self._spans[span.span_id] = span

    def on_span_end(self, span: Span[Any]) -> None:
        with self._lock:
            self._spans[span.span_id] = span

    def shutdown(self) -> None:
        return None

    def force_flush(self) -> None:
        return None

    def _agent_of(self, span: Span[Any]) -> str | None:
        current: Span[Any] | None = span
        while current is not None:
            if isinstance(current.span_data, AgentSpanData):
                return current.span_data.name
            parent = current.parent_id
            current = self._spans.get(parent) if parent is not None else None
        return None

    def failed_model_calls(self) -> int:
        """Model-call spans that ended with an error (e.g. a response the SDK refused)."""
        with self._lock:
            spans = list(self._spans.values())
        kinds = (GenerationSpanData, ResponseSpanData)
        return sum(1 for s in spans if isinstance(s.span_data, kinds) and s.error is not None)

    def model_calls(self) -> list[TracedCall]:
        """Successful model calls (generation or response spans without error), with their agent."""
        with self._lock:
            spans = list(self._spans.values())
        calls = []
        for span in spans:
            data = span.span_data
            if span.error is not None:
                continue
            if isinstance(data, GenerationSpanData):
                key = messages_key(data.input)
            elif isinstance(data, ResponseSpanData) and data.response is not None:
                key = data.response.id
            else:
                continue
            calls.append(TracedCall(self._agent_of(span), span.trace_id, key, data.input))
        return calls
