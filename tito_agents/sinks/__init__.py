"""Sinks: where samples go. A small interface (write / flush / close, sync and async), the embedded
default (a local JSON Lines file), and sinks at scale: rotating columnar files, an asyncio queue,
Redis Streams and Ray, with buffering, retries and spill-to-disk (`open_sink` picks one from a
path or URL). `read_samples` reads back what the file sinks wrote, whatever the format (Redis and
Ray have their own readers). Optional libraries (pyarrow, redis, ray) are imported only when used."""

from tito_agents.config import DeliveryStats
from tito_agents.sinks.base import CallbackSink, MemorySink, Sink
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.files import RotatingFileSink, read_file_table
from tito_agents.sinks.jsonl import JsonlSink
from tito_agents.sinks.partition import PartitionedSink
from tito_agents.sinks.queue import AsyncQueueSink
from tito_agents.sinks.reading import SampleSource, read_samples, register_reader
from tito_agents.sinks.registry import open_sink
from tito_agents.sinks.retry import Backoff

__all__ = [
    "AsyncQueueSink",
    "Backoff",
    "BufferedSink",
    "CallbackSink",
    "DeliveryStats",
    "JsonlSink",
    "MemorySink",
    "PartitionedSink",
    "RotatingFileSink",
    "SampleSource",
    "Sink",
    "open_sink",
    "read_file_table",
    "read_samples",
    "register_reader",
]
