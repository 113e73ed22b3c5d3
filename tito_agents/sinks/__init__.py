"""Sinks: where samples go. A small interface (write / flush / close, sync and async) and the
embedded default, a local JSON Lines file."""

from tito_agents.sinks.base import CallbackSink, MemorySink, Sink
from tito_agents.sinks.jsonl import JsonlSink, read_samples

__all__ = ["CallbackSink", "JsonlSink", "MemorySink", "Sink", "read_samples"]
