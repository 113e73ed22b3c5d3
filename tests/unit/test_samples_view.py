"""`Sample.view` through every sink format and reader, files written before the field existed, and
the reader's refusal of what is not a token id (as capture refuses it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.support.cli_samples import merged_episode, run_cli, write_samples
from tito_agents.errors import SampleFormatError
from tito_agents.samples import Sample
from tito_agents.sinks import read_samples
from tito_agents.sinks.codec import decode_fields, decode_frame, encode_fields, encode_frame
from tito_agents.sinks.jsonl import encode_sample

pa = pytest.importorskip("pyarrow", reason="the columnar formats need pyarrow")
pq = pytest.importorskip("pyarrow.parquet", reason="the columnar formats need pyarrow")

from tito_agents.sinks import columnar  # noqa: E402
from tito_agents.sinks.files import RotatingFileSink  # noqa: E402


def _views(samples: list[Sample]) -> list[str]:
    return [s.view for s in samples]


EXPECTED = ["merged", "merged", "merged", "per_call", "merged"]


def test_hand_built_episode_has_both_views() -> None:
    assert _views(merged_episode()) == EXPECTED


def test_view_round_trips_through_json_lines(tmp_path: Path) -> None:
    """JSON Lines carries `view` as a field and the reader gives it back."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    assert b'"view":"merged"' in path.read_bytes()
    assert _views(list(read_samples(path))) == EXPECTED


def test_view_round_trips_through_the_binary_codec() -> None:
    """Redis entries (fields) and frames carry `view` in their header."""
    for sample in merged_episode():
        assert decode_frame(encode_frame(sample)).view == sample.view
        fields = {k: bytes(v) for k, v in encode_fields(sample).items()}
        assert decode_fields(fields).view == sample.view


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_view_round_trips_through_rotating_parts(tmp_path: Path, suffix: str) -> None:
    """Parquet, Arrow and JSON Lines parts keep the view column."""
    sink = RotatingFileSink(tmp_path / f"samples{suffix}", max_file_samples=2)
    sink.write(merged_episode()[:3])
    sink.write(merged_episode()[3:])
    sink.close()
    assert _views(list(read_samples(tmp_path / f"samples{suffix}"))) == EXPECTED


def test_json_line_without_view_is_read_with_the_view_its_start_reason_implies(
    tmp_path: Path,
) -> None:
    """Files written before `view` existed: per-call samples start with reason "call"."""
    lines = []
    for sample in merged_episode():
        data = orjson.loads(encode_sample(sample))
        del data["view"]
        lines.append(orjson.dumps(data) + b"\n")
    path = tmp_path / "old.jsonl"
    path.write_bytes(b"".join(lines))
    assert _views(list(read_samples(path))) == EXPECTED


def _without_view(samples: list[Sample]) -> Any:
    batch = columnar.samples_to_batch(samples)
    return batch.drop_columns(["view"])


def test_old_parquet_and_arrow_files_without_the_column(tmp_path: Path) -> None:
    """A Parquet file or Arrow stream without the `view` column reads with implied views; a table
    of old and new parts gets the column (null for the old rows)."""
    old = _without_view(merged_episode())
    pq.write_table(pa.Table.from_batches([old]), tmp_path / "old.parquet")
    assert _views(list(columnar.iter_parquet_samples(tmp_path / "old.parquet"))) == EXPECTED
    stream = tmp_path / "old.arrow"
    with pa.OSFile(str(stream), "wb") as out, pa.ipc.new_stream(out, old.schema) as writer:
        writer.write_batch(old)
    assert _views(list(columnar.iter_stream_samples(stream))) == EXPECTED
    new = tmp_path / "new.parquet"
    pq.write_table(pa.Table.from_batches([columnar.samples_to_batch(merged_episode())]), new)
    table = columnar.read_table([tmp_path / "old.parquet", stream, new])
    assert table.num_rows == 15
    assert table.column("view").to_pylist() == [None] * 10 + EXPECTED


def test_an_old_journal_converts_to_parquet(tmp_path: Path) -> None:
    """Recovery converts an Arrow journal written before the column into a Parquet part."""
    old = _without_view(merged_episode())
    journal = tmp_path / "journal.arrows"
    with pa.OSFile(str(journal), "wb") as out, pa.ipc.new_stream(out, old.schema) as writer:
        writer.write_batch(old)
    rows = columnar.convert_stream_to_parquet(journal, tmp_path / "part.parquet", "zstd", 1024)
    assert rows == 5
    assert _views(list(columnar.iter_parquet_samples(tmp_path / "part.parquet"))) == EXPECTED


def test_an_unknown_view_is_refused() -> None:
    data = orjson.loads(encode_sample(merged_episode()[0]))
    data["view"] = "both"
    with pytest.raises(SampleFormatError, match="view"):
        Sample.from_dict(data)


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ([1, 2, True, 4], "booleans"),
        ([False, 2, 3], "booleans"),
        ([True, True], "booleans"),
        ([1, [2], 3], "not integers"),
        ([[1, 2]], "not integers"),
        ([1, 2.0, 3], "not integers"),
        ([1, "2", 3], "not integers"),
        ([1, -2, 3], "outside"),
        ([1, 2**31, 3], "outside"),
        ([1, 2**70, 3], "not integers"),
        ("123", "expected a list"),
    ],
)
def test_the_reader_refuses_what_is_not_a_token_id(
    tmp_path: Path, ids: Any, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`true` is not id 1 (numpy would say it is), nor 2.0, "2" or a negative number: the reader
    refuses them naming the file, the line and the field, as capture does; so does the CLI."""
    good = encode_sample(merged_episode()[0])
    data = orjson.loads(encode_sample(merged_episode()[1]))
    data["token_ids"] = ids
    if isinstance(ids, list):
        data["loss_mask"] = [0] * len(ids)
        data["logprobs"] = None
        data["spans"] = []
    path = tmp_path / "bad.jsonl"
    path.write_bytes(good + json.dumps(data).encode() + b"\n")  # json: ints beyond 64 bits
    with pytest.raises(SampleFormatError, match=f"bad.jsonl:2: token_ids .*{needle}"):
        list(read_samples(path))
    code, out, err = run_cli(["stats", path], capsys)
    assert code == 2 and out == ""
    assert "bad.jsonl:2: token_ids" in err and needle in err


def test_plain_integer_ids_one_and_zero_are_ids() -> None:
    """The boolean check is about JSON `true`/`false`: the integers 1 and 0 stay ids, and the
    arrays are writable int32 like any sample's."""
    data = orjson.loads(encode_sample(merged_episode()[3]))
    data["token_ids"][:2] = [1, 0]
    data["token_ids"][-1] = 2**31 - 1
    ids = Sample.from_dict(data).token_ids
    assert ids[:2].tolist() == [1, 0] and int(ids[-1]) == 2**31 - 1
    assert ids.dtype == np.int32 and ids.flags.writeable
