"""Sinks partitioned by policy (`open_sink(..., partition_by="policy")`): a file or stream per
policy, named from the spec; samples of unrouted calls in "default"."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import tito_agents as tito
from tests.support.policies_fake import BASE, MultiModelFake
from tito_agents.calls import policy_of
from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.sinks import MemorySink
from tito_agents.sinks.partition import PartitionedSink, partition_spec
from tito_agents.sinks.registry import open_sink
from tito_agents.testing import captured_samples

MSG = [{"role": "user", "content": "hi"}]


def _episode(collector: tito.Collector, fake: MultiModelFake) -> None:
    client = collector.wrap(fake.client())
    with collector.episode("e1", group_id="g") as ep:
        for agent in ("planner", "coder", "other"):
            with tito.agent(agent):
                client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
        ep.set_reward(1.0)


@pytest.mark.parametrize("how", ["query", "keyword"])
def test_a_file_per_policy(tmp_path: Path, how: str) -> None:
    out = tmp_path / "out" / "samples.jsonl"
    sink: Any = f"{out}?partition_by=policy" if how == "query" else None
    if sink is None:
        sink = open_sink(out, partition_by="policy", buffered=True)
    with tito.Collector(sink, policies={"planner": "a", "coder": "org/b"}) as collector:
        _episode(collector, MultiModelFake(names=(BASE, "a", "org/b")))
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == ["samples.a.jsonl", "samples.default.jsonl", "samples.org_b.jsonl"]
    found = {
        name: [(s.agent, policy_of(s)) for s in tito.read_samples(out.parent / name)]
        for name in names
    }
    assert found == {
        "samples.a.jsonl": [("planner", "a")],
        "samples.default.jsonl": [("other", None)],
        "samples.org_b.jsonl": [("coder", "org/b")],
    }


def test_partition_names_of_each_sink_kind() -> None:
    assert partition_spec("", "out/samples.jsonl", None, "a") == ("out/samples.a.jsonl", None)
    assert partition_spec("", "out/s.jsonl.gz", None, "x/y")[0] == "out/s.x_y.jsonl.gz"
    assert partition_spec("", "out/samples.parquet", None, "a")[0] == "out/samples.a.parquet"
    assert partition_spec("redis", "", "samples:{policy}", "a") == ("", "samples:a")
    assert partition_spec("redis", "", "samples", "a") == ("", "samples:a")
    assert partition_spec("ray", "q", None, "a") == ("q-a", None)
    with pytest.raises(ConfigurationError):
        partition_spec("asyncio", "", None, "a")


def test_redis_partitions_are_streams_named_from_the_template() -> None:
    sink = open_sink(
        "redis://127.0.0.1:1/0?stream=rollouts:{policy}&partition_by=policy", buffered=False
    )
    assert isinstance(sink, PartitionedSink)
    opened = sink._open("planner-lora")  # a buffered=False Redis sink connects lazily
    assert "rollouts:planner-lora" in repr(opened)
    opened.close()


def test_memory_partitions_and_agent_key() -> None:
    sink = open_sink("memory://", partition_by="agent")
    assert isinstance(sink, PartitionedSink)
    with tito.Collector(sink) as collector:
        _episode(collector, MultiModelFake())
    parts = sink.sinks
    assert sorted(parts) == ["coder", "other", "planner"]
    assert all(isinstance(p, MemorySink) and len(p.samples) == 1 for p in parts.values())


def test_async_writes_and_closed_sink() -> None:
    with tito.Collector() as collector:
        _episode(collector, MultiModelFake())
        samples = captured_samples(collector)
    made: dict[str, MemorySink] = {}

    def opener(name: str) -> MemorySink:
        made[name] = MemorySink()
        return made[name]

    sink = PartitionedSink(opener, key=lambda s: s.agent)
    asyncio.run(sink.awrite(samples + samples))
    asyncio.run(sink.aflush())
    assert {name: len(m.samples) for name, m in made.items()} == {
        "planner": 2,
        "coder": 2,
        "other": 2,
    }
    asyncio.run(sink.aclose())
    with pytest.raises(SinkError):
        sink.write(samples)


@pytest.mark.parametrize(
    ("spec", "options"),
    [("asyncio://", {}), ("out/x.jsonl", {"bogus": 1}), (MemorySink(), {})],
)
def test_what_cannot_be_partitioned_is_refused(spec: Any, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        open_sink(spec, partition_by="policy", **options)
    with pytest.raises(ConfigurationError):
        PartitionedSink(lambda name: MemorySink(), key="nope")
