"""Reading samples back (`tito_agents.read_samples`): format detection, torn and foreign files,
folders and a sink's parts, the reader registry."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.support.cli_samples import merged_episode, run_cli, write_samples
from tito_agents.errors import SampleFormatError, TruncatedSamplesError
from tito_agents.samples import Sample
from tito_agents.sinks import reading
from tito_agents.sinks.jsonl import encode_sample
from tito_agents.sinks.reading import read_samples, register_reader


def _ids(path: Path | str, **kwargs: bool) -> list[str]:
    return [s.sample_id for s in read_samples(path, **kwargs)]


def test_jsonl_streams_every_sample_in_order(tmp_path: Path) -> None:
    """A JSON Lines file from the sink is read back whole, in order, each time it is iterated."""
    samples = merged_episode()
    opened = read_samples(write_samples(tmp_path / "s.jsonl", samples))
    assert opened.format == "jsonl"
    assert [s.sample_id for s in opened] == [s.sample_id for s in samples]
    assert [s.sample_id for s in opened] == [s.sample_id for s in samples]


def test_line_estimate_is_close_for_uniform_files(tmp_path: Path) -> None:
    """The progress estimate of a JSON Lines file is within 10% of its real line count."""
    sample = merged_episode()[0]
    path = tmp_path / "s.jsonl"
    path.write_bytes(encode_sample(sample) * 5000)
    estimate = read_samples(path).estimated_samples
    assert estimate is not None and abs(estimate - 5000) <= 500


def test_torn_last_line_is_skipped_or_refused_when_strict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A last line cut mid-sample is skipped with a warning; `strict` refuses it up front, with
    an error naming the file."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 9])
    with pytest.raises(TruncatedSamplesError, match="truncated") as info:
        read_samples(path, strict=True)
    assert str(path) in str(info.value)
    assert _ids(path) == [s.sample_id for s in samples[:-1]]
    assert "torn last line" in caplog.text


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    """A final sample missing only its newline is complete, not truncated."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert _ids(path) == [s.sample_id for s in samples]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"hello, this is not json\n", "not a samples file"),
        (b"[1, 2, 3]\n", "not a samples file"),
        (gzip.compress(b'{"a": 1}\n'), "gzip-compressed"),
        (b"PAR1 not really parquet", "truncated parquet file"),
    ],
)
def test_foreign_files_are_refused_up_front(tmp_path: Path, content: bytes, problem: str) -> None:
    """Files that are not samples files are refused before reading, with the reason."""
    path = tmp_path / "data.bin"
    path.write_bytes(content)
    with pytest.raises(SampleFormatError, match=problem):
        read_samples(path)


def test_valid_json_that_is_not_a_sample_names_the_line(tmp_path: Path) -> None:
    """A JSON object without sample fields fails with the file and line number."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode()[:1])
    with open(path, "ab") as handle:
        handle.write(b'{"hello": "world"}\n')
    with pytest.raises(SampleFormatError, match=r"s\.jsonl:2: not a valid sample"):
        list(read_samples(path))


def test_missing_file_and_empty_folder(tmp_path: Path) -> None:
    """A missing path and a folder with no samples files are both refused with what is wrong."""
    with pytest.raises(SampleFormatError, match="no such file"):
        read_samples(tmp_path / "nope.jsonl")
    (tmp_path / "notes.txt").write_text("not samples")
    with pytest.raises(SampleFormatError, match="no samples files"):
        read_samples(tmp_path)


def test_folder_of_parts_is_one_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder of JSONL and Parquet parts reads as one source, parts in name order; hidden
    in-progress parts and spill sub-folders are left out; the CLI takes the folder."""
    from tito_agents.sinks.files import RotatingFileSink

    samples = merged_episode()
    with RotatingFileSink(tmp_path / "samples.parquet", max_file_samples=1) as sink:
        sink.write(samples[:1])
        sink.write(samples[1:2])
    write_samples(tmp_path / "zz-extra.jsonl", samples[2:])
    (tmp_path / ".samples-x.parquet.inprogress.arrows").write_bytes(b"\xff\xff\xff\xff torn")
    (tmp_path / "spill").mkdir()
    (tmp_path / "spill" / "seg.jsonl").write_bytes(b"{not a sample")
    opened = read_samples(tmp_path)
    assert opened.format == "jsonl+parquet" and len(opened.parts) == 3
    assert [s.sample_id for s in opened] == [s.sample_id for s in samples]
    assert opened.estimated_samples is not None
    code, out, _ = run_cli(["stats", tmp_path, "--json"], capsys)
    assert code == 0
    summary = json.loads(out)
    assert summary["samples"] == len(samples) and len(summary["parts"]) == 3
    code, out, _ = run_cli(["show", tmp_path, "--index", str(len(samples) - 1)], capsys)
    assert code == 0 and samples[-1].sample_id[:8] in out


def test_a_bad_part_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A corrupt part in a folder fails with the part's own name, not the folder's."""
    samples = merged_episode()
    write_samples(tmp_path / "a.jsonl", samples)
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(b'{"broken": \n' + encode_sample(samples[0]))
    code, _, err = run_cli(["stats", tmp_path], capsys)
    assert code == 2 and "b.jsonl" in err


def test_wrong_extension_magic_is_reported(tmp_path: Path) -> None:
    """A `.parquet` file without Parquet magic bytes is called out as such."""
    path = tmp_path / "x.parquet"
    path.write_bytes(b"\x00\x01\x02\x03 binary")
    with pytest.raises(SampleFormatError, match="not a parquet file"):
        read_samples(path)


def _fake_parquet(tmp_path: Path) -> Path:
    path = tmp_path / "s.parquet"
    path.write_bytes(b"PAR1" + b"\x00" * 32 + b"PAR1")
    return path


def test_columnar_file_without_its_reader_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Parquet file when no columnar reader is installed: the error names the readers looked for."""
    monkeypatch.setitem(__import__("sys").modules, "tito_agents.sinks.columnar", None)
    with pytest.raises(SampleFormatError, match=r"parquet samples need .*sinks\.columnar"):
        read_samples(_fake_parquet(tmp_path))


def test_registered_reader_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`register_reader` installs the reader of a format explicitly."""
    samples = merged_episode()[:2]
    monkeypatch.setattr(reading, "_READERS", dict(reading._READERS))
    register_reader("parquet", lambda path: iter(samples))
    assert _ids(_fake_parquet(tmp_path)) == [s.sample_id for s in samples]


def _columnar_part(tmp_path: Path, file_format: str, samples: list[Sample]) -> Path:
    pytest.importorskip("pyarrow", reason="the columnar sinks need pyarrow")
    from tito_agents.sinks.files import RotatingFileSink, list_parts

    sink = RotatingFileSink(tmp_path / f"samples.{file_format}")
    sink.write(samples)
    sink.close()
    (part,) = list_parts(tmp_path / f"samples.{file_format}")
    return part


@pytest.mark.parametrize("file_format", ["parquet", "arrow"])
def test_columnar_sink_files_are_read_with_their_reader(
    tmp_path: Path, file_format: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Parquet and Arrow parts written by the columnar sinks stream back whole; `stats` reads them."""
    samples = merged_episode()
    part = _columnar_part(tmp_path, file_format, samples)
    opened = read_samples(part)
    assert opened.format == file_format
    assert [s.sample_id for s in opened] == [s.sample_id for s in samples]
    if file_format == "parquet":
        assert opened.estimated_samples == len(samples) and opened.count_is_exact
    code, out, _ = run_cli(["stats", part, "--json"], capsys)
    assert code == 0 and json.loads(out)["samples"] == len(samples)


def test_torn_arrow_stream(tmp_path: Path) -> None:
    """An Arrow stream without its end marker is read up to its last complete batch; `strict`
    refuses it as truncated."""
    samples = merged_episode()
    part = _columnar_part(tmp_path, "arrow", samples)
    part.write_bytes(part.read_bytes()[:-8])  # drop the end-of-stream marker
    with pytest.raises(TruncatedSamplesError, match="truncated Arrow stream"):
        read_samples(part, strict=True)
    assert _ids(part) == [s.sample_id for s in samples]


def test_corrupt_parquet_body(tmp_path: Path) -> None:
    """A Parquet file with intact magic bytes but a damaged body: a one-line read error, not a crash."""
    part = _columnar_part(tmp_path, "parquet", merged_episode())
    data = bytearray(part.read_bytes())
    data[8:-8] = b"\x00" * (len(data) - 16)
    part.write_bytes(bytes(data))
    with pytest.raises(SampleFormatError, match="cannot read this parquet file"):
        list(read_samples(part))


@pytest.mark.parametrize("final_newline", [False, True])
def test_pretty_printed_json_is_named_not_called_truncated(
    tmp_path: Path, final_newline: bool
) -> None:
    """One sample pretty-printed over several lines (e.g. `jq .`'s output, with or without a final
    newline) is refused as pretty-printed JSON with the command that converts it, never as a
    truncated file or a bad line."""
    sample = merged_episode()[0]
    text = json.dumps(json.loads(encode_sample(sample)), indent=2)
    path = tmp_path / "one.json"
    path.write_text(text + ("\n" if final_newline else ""))
    with pytest.raises(SampleFormatError, match="pretty-printed JSON") as info:
        read_samples(path)
    message = str(info.value)
    assert "truncated" not in message and "jq -c ." in message and str(path) in message


def test_jsonl_with_a_blank_first_line_is_still_jsonl(tmp_path: Path) -> None:
    """A blank first line (skipped by the reader) does not make a one-sample file look pretty-printed."""
    sample = merged_episode()[0]
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\n" + encode_sample(sample))
    assert _ids(path) == [sample.sample_id]


def test_parts_still_being_written_are_left_out_and_named(tmp_path: Path) -> None:
    """A sink's path with only in-progress parts: nothing finished to read, said so; beside
    finished parts they are left out (`left_out`) unless `include_in_progress`."""
    from tito_agents.sinks.files import RotatingFileSink

    samples = merged_episode()
    path = tmp_path / "samples.jsonl"
    first = RotatingFileSink(path)
    first.write(samples[:2])
    with pytest.raises(TruncatedSamplesError, match="only parts still being written"):
        read_samples(path)
    assert _ids(path, include_in_progress=True) == [s.sample_id for s in samples[:2]]
    first.close()
    second = RotatingFileSink(path)
    second.write(samples[2:])
    try:
        opened = read_samples(path)
        assert len(opened.left_out) == 1 and len(opened.parts) == 1
        assert [s.sample_id for s in opened] == [s.sample_id for s in samples[:2]]
        # two runs opened within a second: their parts' order by name is their run ids' order
        every = _ids(tmp_path, include_in_progress=True)
        assert sorted(every) == sorted(s.sample_id for s in samples)
    finally:
        second.close()


def test_a_sink_spec_reads_the_files_it_names(tmp_path: Path) -> None:
    """What a Collector was given (a `file://` URL, a path with sink options) reads back as is."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    want = [s.sample_id for s in samples]
    assert _ids(f"file://{path}") == want
    assert _ids(f"{path}?max_file_samples=10") == want
