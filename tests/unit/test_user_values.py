"""Values users hand the library as they come: step counters as ids and version labels, numpy
scalars and arrays in metadata and labels. Every file format writes every sample (the Parquet and
Arrow sinks refused them before: string columns, strict JSON), and reads back the same: ids as
strings, metadata as plain JSON."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import numpy as np
import openai
import orjson
import pytest

import tito_agents as tito
from tito_agents._values import as_text, json_bytes
from tito_agents.sinks import read_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

pytest.importorskip("pyarrow", reason="the Parquet and Arrow sinks need pyarrow")


class Opaque:
    def __str__(self) -> str:
        return "opaque-object"


EPISODES: list[dict[str, Any]] = [
    {"episode_id": 42, "group_id": np.int64(3), "task_id": 5, "agent": np.int32(7)},
    {
        "episode_id": "meta",
        "metadata": {
            "step": np.int64(3),
            "scores": np.arange(3, dtype=np.float32),
            "flag": np.bool_(True),
            "when": datetime.date(2026, 12, 2),
            "tags": {"b"},
            7: "int key",
            "raw": b"bytes",
            "object": Opaque(),
            "nested": {"t": (1, np.float64(2.5))},
        },
        "labels": {"turn": np.int64(2), "node": "solver"},
        "reward": np.float32(0.5),
    },
]


def _run(path: Path) -> tito.Collector:
    fake = FakeVLLM(FakeConfig())
    http = openai.DefaultHttpxClient(transport=mock_transport(fake))
    with tito.Collector(str(path)) as collector:
        client = collector.wrap(
            openai.OpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
        )
        for spec in EPISODES:
            opened = {k: v for k, v in spec.items() if k not in ("labels", "reward")}
            with collector.episode(**opened) as ep, tito.labels(**spec.get("labels", {})):
                client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                if "reward" in spec:
                    ep.set_reward(spec["reward"])
    return collector


@pytest.mark.parametrize("suffix", ["jsonl", "parquet", "arrow"])
def test_every_format_writes_and_reads_back_what_users_pass(tmp_path: Path, suffix: str) -> None:
    collector = _run(tmp_path / f"samples.{suffix}")
    delivery = collector.stats.delivery
    assert delivery is None or (delivery.rejected, delivery.last_error) == (0, None)
    by_episode = {s.episode_id: s for s in read_samples(tmp_path / f"samples.{suffix}")}
    assert set(by_episode) == {"42", "meta"}
    ids = by_episode["42"]
    assert (ids.group_id, ids.task_id, ids.agent) == ("3", "5", "7")
    meta = by_episode["meta"]
    assert meta.reward == 0.5
    assert meta.metadata["step"] == 3 and meta.metadata["scores"] == [0.0, 1.0, 2.0]
    assert meta.metadata["flag"] is True and meta.metadata["when"] == "2026-12-02"
    assert meta.metadata["tags"] == ["b"] and meta.metadata["7"] == "int key"
    assert meta.metadata["raw"] == "bytes" and meta.metadata["object"] == "opaque-object"
    assert meta.metadata["nested"] == {"t": [1, 2.5]}
    assert meta.metadata["labels"] == {"turn": 2, "node": "solver"}


@pytest.mark.parametrize("bad", [1.5, True, ["a"], {"a": 1}, np.float64(2.0)])
def test_ids_that_are_not_strings_or_ints_are_refused_where_they_are_given(bad: Any) -> None:
    with tito.Collector() as collector:
        for field in ("episode_id", "group_id", "task_id", "agent"):
            with pytest.raises(ValueError, match=field):
                collector.episode(**{field: bad})
        with pytest.raises(ValueError, match="agent"), tito.agent(bad):
            pass


def test_as_text_and_json_bytes() -> None:
    assert [as_text(v, "x") for v in (None, "a", 3, np.uint8(4))] == [None, "a", "3", "4"]
    assert orjson.loads(json_bytes({"a": np.int16(1), "b": np.array([[1, 2]]), 3: None})) == {
        "a": 1,
        "b": [[1, 2]],
        "3": None,
    }


def test_an_episode_metadata_entry_named_like_the_labels_is_kept(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Call labels go to `metadata["labels"]` (per call) or `["call_labels"]` (merged); an episode
    metadata entry of that name was overwritten silently. A dict is merged (labels win per key),
    anything else is kept and the labels are left out, with a warning."""
    from tests.support.call_factory import make_call
    from tito_agents.assembly import AssemblyOptions, EpisodeContext, assemble
    from tito_agents.assembly import options as options_module

    monkeypatch.setattr(options_module, "_WARNED", set())  # logged once per process
    call = make_call("c1", [1, 2], [3], labels={"step": 1})
    merged = AssemblyOptions.of("merged")
    for meta, per_call, chained in [
        ({"labels": {"run": "a", "step": 0}}, {"run": "a", "step": 1}, {"c1": {"step": 1}}),
        ({"labels": "mine", "call_labels": "also mine"}, "mine", "also mine"),
        ({"split": "train"}, {"step": 1}, {"c1": {"step": 1}}),
    ]:
        context = EpisodeContext("ep", metadata=meta)
        (one,), _ = assemble([call], context)
        assert one.metadata["labels"] == per_call
        (joined,), _ = assemble([call], context, merged)
        assert joined.metadata["call_labels"] == chained
        assert all(one.metadata[k] == v for k, v in meta.items() if k != "labels")
    assert {"labels", "call_labels"} <= options_module._WARNED
    assert sum("not a dict" in r.getMessage() for r in caplog.records) == 2
