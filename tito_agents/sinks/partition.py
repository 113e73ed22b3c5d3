"""One sink per partition of the samples: a file or stream per policy (or per agent).

A multi-policy run (`Collector(policies=...)`: one model / LoRA adapter per agent) trains each
policy on its own samples, often in its own trainer process; writing them apart saves every
reader a filter over everyone's samples. `open_sink(spec, partition_by="policy")` (or
`?partition_by=policy` in the spec) gives a `PartitionedSink` that opens, on first use, the sink
`spec` names for each partition (`partition_spec`):

    out/samples.jsonl                      -> out/samples.<policy>.jsonl
    out/samples.parquet                    -> out/samples.<policy>.parquet (its own parts)
    redis://host/0?stream=samples:{policy} -> stream samples:<policy> ("{policy}" is replaced;
                                              a stream without it gets ":<policy>" appended)
    ray://tito-samples                     -> the queue actor tito-samples-<policy>
    memory://                              -> one MemorySink per policy (`sinks`)

Samples whose calls no mapping routed (no policy) go to the partition named "default". Each
partition is a sink of its own: its own buffer and spill folder when buffered, its own delivery
counters (`sinks[name].stats`). A write that spans partitions is one write per partition, so a
failure may leave the samples of another partition written (each sample is still written whole
or not at all, as every sink promises).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from pathlib import PurePath

from tito_agents.calls import policy_of
from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.samples import Sample
from tito_agents.sinks.base import Sink

__all__ = ["DEFAULT_PARTITION", "PARTITION_KEYS", "PartitionedSink", "partition_spec"]

DEFAULT_PARTITION = "default"
"""The partition of samples the key names nothing for (no policy, no agent)."""

PARTITION_KEYS: dict[str, Callable[[Sample], str | None]] = {
    "policy": policy_of,
    "agent": lambda sample: sample.agent,
}
"""The keys `partition_by` accepts by name."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_COMPRESSED = (".gz", ".zst", ".zstd", ".bz2", ".xz", ".lz4")


def safe_name(name: str) -> str:
    """A partition name as it may appear in a file or queue name (letters, digits, `._-`)."""
    return _UNSAFE.sub("_", name).strip("._") or DEFAULT_PARTITION


class PartitionedSink(Sink):
    """Routes each sample to the sink of its partition, opened by `open_partition(name)` the
    first time a sample of that partition arrives. `key`: "policy", "agent" or a function of
    the sample (None: `default`)."""

    def __init__(
        self,
        open_partition: Callable[[str], Sink],
        key: str | Callable[[Sample], str | None] = "policy",
        *,
        default: str = DEFAULT_PARTITION,
    ) -> None:
        if isinstance(key, str):
            if key not in PARTITION_KEYS:
                raise ConfigurationError(
                    f"partition_by must be one of {sorted(PARTITION_KEYS)} or a function, "
                    f"not {key!r}"
                )
            key = PARTITION_KEYS[key]
        self._open = open_partition
        self._key = key
        self._default = default
        self._sinks: dict[str, Sink] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def sinks(self) -> dict[str, Sink]:
        """The sinks opened so far, by partition name (a copy)."""
        with self._lock:
            return dict(self._sinks)

    def partition_of(self, sample: Sample) -> str:
        """The partition name of `sample`."""
        name = self._key(sample)
        return self._default if name is None else str(name)

    def _groups(self, samples: Sequence[Sample]) -> list[tuple[Sink, list[Sample]]]:
        groups: dict[str, list[Sample]] = {}
        for sample in samples:
            groups.setdefault(self.partition_of(sample), []).append(sample)
        with self._lock:
            if self._closed:
                raise SinkError("the partitioned sink is closed", retryable=False)
            out = []
            for name, members in groups.items():
                sink = self._sinks.get(name)
                if sink is None:
                    sink = self._sinks[name] = self._open(name)
                out.append((sink, members))
        return out

    def write(self, samples: Sequence[Sample]) -> None:
        for sink, members in self._groups(samples):
            sink.write(members)

    async def awrite(self, samples: Sequence[Sample]) -> None:
        for sink, members in self._groups(samples):
            await sink.awrite(members)

    def flush(self) -> None:
        for sink in self.sinks.values():
            sink.flush()

    async def aflush(self) -> None:
        for sink in self.sinks.values():
            await sink.aflush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sinks = list(self._sinks.values())
        for sink in sinks:
            sink.close()

    async def aclose(self) -> None:
        with self._lock:
            self._closed = True
            sinks = list(self._sinks.values())
        for sink in sinks:
            await sink.aclose()


def partition_spec(scheme: str, path: str, stream: str | None, name: str) -> tuple[str, str | None]:
    """The (path or queue name, Redis stream) of partition `name` of a sink spec: a file path
    gets `.<name>` before its format suffix, a Ray queue `-<name>`, a Redis stream its
    `{policy}` / `{partition}` placeholder replaced (or `:<name>` appended)."""
    safe = safe_name(name)
    if scheme in ("redis", "rediss"):
        assert stream is not None
        for placeholder in ("{policy}", "{partition}", "{agent}"):
            if placeholder in stream:
                return path, stream.replace(placeholder, name)
        return path, f"{stream}:{name}"
    if scheme == "ray":
        return f"{path}-{safe}", None
    if scheme in ("", "file"):
        pure = PurePath(path)
        suffixes = pure.suffixes
        compressed = pure.suffix in _COMPRESSED and len(suffixes) >= 2
        suffix = "".join(suffixes[-2:]) if compressed else pure.suffix
        stem = pure.name[: len(pure.name) - len(suffix)] if suffix else pure.name
        return str(pure.with_name(f"{stem}.{safe}{suffix}")), None
    raise ConfigurationError(f"a {scheme}:// sink cannot be partitioned (one reader per queue)")
