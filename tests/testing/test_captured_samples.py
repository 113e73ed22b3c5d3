"""`tito_agents.testing.captured_samples`: the typed read of what a test's collector captured."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tito_agents as tito
from tito_agents.sinks import CallbackSink, JsonlSink, MemorySink
from tito_agents.testing import captured_samples


def sample(sample_id: str) -> tito.Sample:
    return tito.Sample(
        sample_id=sample_id,
        episode_id="ep",
        agent=None,
        token_ids=np.array([1, 2, 3], dtype=np.int32),
        loss_mask=np.array([0, 1, 1], dtype=np.int8),
        logprobs=None,
        reward=None,
        call_ids=[],
        spans=[],
    )


def test_reads_the_default_memory_sink_in_write_order_as_a_copy() -> None:
    collector = tito.Collector()
    assert captured_samples(collector) == []
    assert isinstance(collector.sink, MemorySink)
    first, second = sample("a"), sample("b")
    collector.sink.write([first])
    collector.sink.write([second])
    got = captured_samples(collector)
    assert [s.sample_id for s in got] == ["a", "b"] and got[0] is first
    got.clear()  # the caller's list, not the sink's
    assert [s.sample_id for s in captured_samples(collector)] == ["a", "b"]


@pytest.mark.parametrize("kind", ["callback", "jsonl"])
def test_a_sink_that_keeps_no_samples_is_a_clear_type_error(tmp_path: Path, kind: str) -> None:
    sink = CallbackSink(lambda samples: None) if kind == "callback" else JsonlSink(tmp_path / "s")
    with (
        tito.Collector(sink) as collector,
        pytest.raises(TypeError, match=f"MemorySink.*{type(sink).__name__}"),
    ):
        captured_samples(collector)
