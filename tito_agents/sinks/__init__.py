"""Sinks: where samples go. A small interface (write / flush / close, sync and async), the embedded
default (a local JSON Lines file), and sinks at scale: rotating columnar files, an asyncio queue,
Redis Streams and Ray, with buffering, retries and spill-to-disk (`open_sink` picks one from a
path or URL). Optional libraries (pyarrow, redis, ray) are imported only when used."""

import warnings as _warnings

from tito_agents.sinks.base import CallbackSink, MemorySink, Sink
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.files import RotatingFileSink, read_file_samples, read_file_table
from tito_agents.sinks.jsonl import JsonlSink, read_samples
from tito_agents.sinks.partition import PartitionedSink
from tito_agents.sinks.policy import RetryPolicy
from tito_agents.sinks.queue import AsyncQueueSink
from tito_agents.sinks.registry import open_sink
from tito_agents.stats import DeliveryStats

__all__ = [
    "AsyncQueueSink",
    "BufferedSink",
    "CallbackSink",
    "DeliveryStats",
    "JsonlSink",
    "MemorySink",
    "PartitionedSink",
    "RetryPolicy",
    "RotatingFileSink",
    "Sink",
    "open_sink",
    "read_file_samples",
    "read_file_table",
    "read_samples",
]


def __getattr__(name: str) -> type[DeliveryStats]:
    """`ExportStats`: the deprecated name of `DeliveryStats`, with a warning."""
    if name != "ExportStats":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _warnings.warn(
        "tito_agents.sinks.ExportStats is deprecated: use tito_agents.sinks.DeliveryStats",
        DeprecationWarning,
        stacklevel=2,
    )
    return DeliveryStats
