"""The samples a test's collector captured, typed: `captured_samples(collector)`.

A `Collector()` made without a sink keeps its samples in a `MemorySink`, but `Collector.sink` is
typed as any `Sink` (a file, Redis, a `BufferedSink`...), so tests that read
`collector.sink.samples` needed a `# type: ignore` that would also hide a test reading a sink that
keeps nothing. This helper narrows the type and says what went wrong when the sink holds no
samples.

The name is an adjective, not a verb: it reads what was captured and captures nothing itself. It
does not flush either: samples of ended episodes are in the sink when the episode's exit returns;
those of calls outside any episode once `collector.flush()` returns.
"""

from __future__ import annotations

from tito_agents.collector import Collector
from tito_agents.samples import Sample
from tito_agents.sinks import MemorySink

__all__ = ["captured_samples"]


def captured_samples(collector: Collector) -> list[Sample]:
    """The samples `collector` wrote to its `MemorySink` so far (the default sink of
    `Collector()`), as a new list in the order they were written.

    Raises TypeError when the collector writes to another kind of sink (a file, a queue, a
    `BufferedSink`), which keeps no samples to read back.
    """
    sink = collector.sink
    if not isinstance(sink, MemorySink):
        raise TypeError(
            f"captured_samples needs a collector that keeps its samples in a MemorySink (the "
            f"default of Collector()); this one writes to a {type(sink).__name__}"
        )
    return list(sink.samples)
