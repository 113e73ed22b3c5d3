"""Rotating sample files: formats, rotation, atomic finalize, crash recovery, disk full."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tito_agents as tito
from tito_agents.errors import SinkError
from tito_agents.samples import Sample
from tito_agents.sinks import columnar
from tito_agents.sinks.files import (
    RotatingFileSink,
    list_parts,
    read_file_table,
    recover_parts,
)
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.reading import read_samples

FORMATS = ["samples.parquet", "samples.arrow", "samples.jsonl"]


def make(n: int, tokens: int = 64, start: int = 0) -> list[Sample]:
    return [synthetic_sample(i, tokens, logprobs=i % 3 != 0) for i in range(start, start + n)]


def ids(samples: Iterable[Sample]) -> list[str]:
    return [s.sample_id for s in samples]


@pytest.mark.parametrize("name", FORMATS)
def test_roundtrip_keeps_every_field(tmp_path: Path, name: str) -> None:
    """What a file sink writes, read_samples returns field for field, in order."""
    samples = make(10)
    with RotatingFileSink(tmp_path / name) as sink:
        sink.write(samples[:3])
        sink.write(samples[3:])
    back = list(read_samples(tmp_path / name))
    assert ids(back) == ids(samples)
    for a, b in zip(samples, back, strict=True):
        assert np.array_equal(a.token_ids, b.token_ids) and b.token_ids.dtype == np.int32
        assert np.array_equal(a.loss_mask, b.loss_mask) and b.loss_mask.dtype == np.uint8
        assert (a.logprobs is None) == (b.logprobs is None)
        if a.logprobs is not None and b.logprobs is not None:
            assert np.array_equal(a.logprobs, b.logprobs)
        assert (a.reward, a.task_id, a.group_id, a.agent, a.model) == (
            b.reward,
            b.task_id,
            b.group_id,
            b.agent,
            b.model,
        )
        assert [sp.to_dict() for sp in a.spans] == [sp.to_dict() for sp in b.spans]
        assert a.metadata == b.metadata and a.call_ids == b.call_ids


@pytest.mark.parametrize("name", FORMATS)
def test_a_home_relative_path_is_the_users_home_not_a_folder_named_tilde(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`"~/runs/samples.jsonl"` once made a folder literally named "~" in the working directory."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with tito.Collector(f"~/runs/{name}") as collector:
        collector.sink.write(make(3))
    assert list(work.iterdir()) == []
    assert ids(read_samples(f"~/runs/{name}")) == ids(make(3))
    assert ids(read_samples(home / "runs" / name)) == ids(make(3))


@pytest.mark.parametrize("name", FORMATS)
def test_parts_rotate_and_appear_only_when_finished(tmp_path: Path, name: str) -> None:
    """Rotation by count makes several parts in write order; an unfinished part is invisible."""
    sink = RotatingFileSink(tmp_path / name, max_file_samples=4)
    samples = make(10)
    for sample in samples:
        sink.write([sample])
    assert len(list_parts(tmp_path / name)) == 2  # the third part is still in progress
    assert ids(read_samples(tmp_path / name)) == ids(samples[:8])
    assert ids(read_samples(tmp_path / name, include_in_progress=True)) == ids(samples)
    sink.close()
    sink.close()  # idempotent
    parts = list_parts(tmp_path / name)
    assert len(parts) == 3 and all(not p.name.startswith(".") for p in parts)
    assert ids(read_samples(tmp_path / name)) == ids(samples)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_rotation_by_size(tmp_path: Path) -> None:
    """A part is finished once its in-progress bytes reach max_file_bytes."""
    with RotatingFileSink(tmp_path / "s.arrow", max_file_bytes=20_000) as sink:
        for sample in make(8, tokens=1000):
            sink.write([sample])
    assert len(list_parts(tmp_path / "s.arrow")) >= 3


_CRASH = textwrap.dedent(
    """
    import os, sys
    from tito_agents.sinks.files import RotatingFileSink
    from tito_agents.sinks.harness import synthetic_sample
    sink = RotatingFileSink(sys.argv[1], max_file_samples=int(sys.argv[2]))
    for i in range(int(sys.argv[3])):
        sink.write([synthetic_sample(i, 128)])
    print("written", flush=True)
    os._exit(9)  # a crash: no close, no at-exit hooks
    """
)


@pytest.mark.parametrize("name", FORMATS)
def test_after_a_crash_every_written_sample_is_readable(tmp_path: Path, name: str) -> None:
    """A writer killed mid-part loses nothing whose write returned: the next sink on the path
    finalizes the dead writer's in-progress part."""
    path = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, str(path), "5", "13"], capture_output=True, check=False
    )
    assert done.returncode == 9 and b"written" in done.stdout
    assert len(list(read_samples(path))) == 10  # two finished parts; the third in progress
    sink = RotatingFileSink(path)
    assert (sink.stats.recovered_parts, sink.stats.recovered_samples) == (1, 3)
    sink.close()
    assert ids(read_samples(path)) == [f"ep{i // 4}/{i}" for i in range(13)]


@pytest.mark.parametrize("name", ["samples.arrow", "samples.jsonl", "samples.parquet"])
def test_a_torn_tail_is_cut_off_on_recovery(tmp_path: Path, name: str) -> None:
    """Half a batch at the end of a crashed part (a crash mid-write) is dropped; whole batches
    before it are kept."""
    path = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, str(path), "100", "4"], capture_output=True, check=False
    )
    assert done.returncode == 9
    (journal,) = [p for p in tmp_path.iterdir() if ".inprogress." in p.name]
    with open(journal, "ab") as handle:
        handle.write(b"\xff\xff\xff\xff\x10\x00" + b"\x07" * 100)  # the start of a torn batch
    parts, recovered = recover_parts(tmp_path)
    assert (parts, recovered) == (1, 4)
    assert ids(read_samples(path)) == [f"ep{i // 4}/{i}" for i in range(4)]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_live_writers_part_is_not_recovered(tmp_path: Path) -> None:
    """Recovery leaves alone the in-progress part of a writer that is still running."""
    live = RotatingFileSink(tmp_path / "s.parquet")
    live.write(make(2))
    other = RotatingFileSink(tmp_path / "s.parquet")
    assert other.stats.recovered_parts == 0
    other.close()
    live.close()
    assert len(list(read_samples(tmp_path / "s.parquet"))) == 2


class _FailingWriter:
    """Wraps a part writer: the n-th write leaves half a batch on disk, then fails ENOSPC."""

    def __init__(self, inner: Any, fail_on: int) -> None:
        self.inner, self.fail_on, self.calls = inner, fail_on, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def good_size(self) -> int:
        return int(self.inner.good_size)

    def write(self, samples: list[Sample]) -> int:
        self.calls += 1
        if self.calls == self.fail_on:
            with open(self.inner.path, "ab") as handle:
                handle.write(b"\x00" * 333)
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self.inner.write(samples))


@pytest.mark.parametrize("name", ["samples.arrow", "samples.parquet"])
def test_disk_full_mid_write_never_leaves_half_a_batch(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write refused by the disk raises a retryable SinkError, leaves no partial sample in any
    file, and the next write goes on in a new part."""
    original = RotatingFileSink._new_writer

    def failing(self: RotatingFileSink, journal: Path) -> Any:
        return _FailingWriter(original(self, journal), fail_on=3)

    monkeypatch.setattr(RotatingFileSink, "_new_writer", failing)
    samples = make(8)
    sink = RotatingFileSink(tmp_path / name)
    sink.write(samples[0:2])
    sink.write(samples[2:4])
    with pytest.raises(SinkError) as caught:
        sink.write(samples[4:6])
    assert caught.value.retryable
    sink.write(samples[6:8])
    sink.close()
    assert sink.stats.write_failures == 1
    assert ids(read_samples(tmp_path / name)) == ids(samples[:4] + samples[6:])


def test_read_file_table_gives_columns(tmp_path: Path) -> None:
    """Finalized parts load as one Arrow table with typed token columns."""
    with RotatingFileSink(tmp_path / "s.parquet", max_file_samples=3) as sink:
        sink.write(make(7))
    table = read_file_table(tmp_path / "s.parquet")
    assert table.num_rows == 7
    token_type = table.schema.field("token_ids").type
    assert str(token_type.value_type) == "int32" and token_type.num_fields == 1
    assert table.column("sample_id").to_pylist() == ids(make(7))


@pytest.mark.parametrize(("name", "builder"), [("s.parquet", "parquet"), ("s.arrow", "arrow")])
def test_hugging_face_datasets_reads_the_parts(tmp_path: Path, name: str, builder: str) -> None:
    """`datasets.load_dataset` reads the finished parts directly, token ids intact."""
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets not installed")
    samples = make(6, tokens=200)
    with RotatingFileSink(tmp_path / name, max_file_samples=4) as sink:
        sink.write(samples)
    files = [str(p) for p in list_parts(tmp_path / name)]
    dataset = datasets.load_dataset(
        builder, data_files=files, split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    assert dataset.num_rows == 6
    assert dataset[5]["token_ids"] == samples[5].token_ids.tolist()
    assert dataset[5]["loss_mask"] == samples[5].loss_mask.tolist()
    assert dataset[0]["logprobs"] is None  # not captured for that sample


def test_parquet_token_columns_skip_dictionary_encoding(tmp_path: Path) -> None:
    """Token columns are written without dictionary pages (3-4x faster writes)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    with RotatingFileSink(tmp_path / "s.parquet") as sink:
        sink.write(make(4))
    (part,) = list_parts(tmp_path / "s.parquet")
    meta = pq.ParquetFile(part).metadata.row_group(0)
    for i in range(meta.num_columns):
        column = meta.column(i)
        if column.path_in_schema.startswith(columnar.TOKEN_COLUMNS):
            assert not column.has_dictionary_page, column.path_in_schema
            assert column.compression == "ZSTD"


def test_a_failed_parquet_encoder_falls_back_to_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If building the Parquet file beside the journal fails, the part is converted from the
    journal at finalize: every written sample is still in the finished file."""
    calls = {"n": 0}
    original = columnar._RowGroups.add

    def flaky_add(self: Any, batch: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EIO, "encoder failed")
        original(self, batch)

    monkeypatch.setattr(columnar._RowGroups, "add", flaky_add)
    samples = make(9)
    with RotatingFileSink(tmp_path / "s.parquet") as sink:
        for i in range(0, 9, 3):
            sink.write(samples[i : i + 3])
    assert ids(read_samples(tmp_path / "s.parquet")) == ids(samples)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
