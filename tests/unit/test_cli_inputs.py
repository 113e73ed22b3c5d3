"""The command on inputs people really hand it: `~` paths, empty files, foreign or malformed JSON,
NaN rewards, outputs that cannot be written. Each ends in a result or one line on stderr naming the
file (exit 2), never a traceback, never a partial output file."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest

from tests.support.cli_samples import run_cli, write_samples
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.testing.smollm2 import tokenizer_dir


def _one_error_line(err: str, names: str) -> str:
    """The single stderr line, checked to be an error naming `names` (no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tito-agents: error: "), err
    assert names in lines[0] and "Traceback" not in err
    return lines[0]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway home folder, so `~` names a place the test owns."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    return folder


def test_tilde_is_expanded_in_samples_tokenizer_and_output_paths(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A quoted `~` (or `--html=~/...`, which the shell leaves alone) names the home folder, as it
    does for the library's sinks: a folder of hand-named files, a tokenizer, an HTML page."""
    runs = home / "runs"
    runs.mkdir()
    write_samples(runs / "a.jsonl", [synthetic_sample(i, 16) for i in range(3)])
    write_samples(runs / "b.jsonl", [synthetic_sample(i, 16) for i in range(3, 5)])
    (home / "tok").symlink_to(tokenizer_dir())

    code, out, err = run_cli(["stats", "~/runs", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["file"] == str(runs) and data["samples"] == 5

    code, out, err = run_cli(["drift", "~/runs/a.jsonl", "--tokenizer", "~/tok", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["file"] == str(runs / "a.jsonl")

    code, out, err = run_cli(["show", "~/runs/b.jsonl", "--html=~/page.html", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["html"] == str(home / "page.html")
    assert "<html" in (home / "page.html").read_text(encoding="utf-8").lower()


@pytest.mark.parametrize("content", [b"", b"\n\n"], ids=["empty", "blank-lines"])
def test_show_on_a_file_without_samples_names_the_file(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show` on a file of zero samples says which file holds none (as `stats` does)."""
    path = tmp_path / "samples.jsonl"
    path.write_bytes(content)
    code, out, err = run_cli(["show", path], capsys)
    assert code == 2 and out == ""
    assert "no sample #0 among 0 samples" in _one_error_line(err, str(path))


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not UTF-8"),
        (b'{"tito": 5}', "malformed"),
        (b'{"tito": {"bf16": {"packed": {"tokens": 3}}}}', "missing field 'free'"),
        (b'{"rows": [{"pipeline": "tito"}]}', "missing field"),
        (b'{"tito": {}}', "holds no figures"),
        (b'{"rows": []}', "holds no figures"),
    ],
    ids=["png", "tito-not-a-mapping", "figures-without-free", "loop-row-cut", "no-tito", "no-rows"],
)
def test_compare_refuses_what_is_not_a_usable_comparison(
    tmp_path: Path, content: bytes, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A binary file, a comparison of the wrong shape or one with nothing in it: one line naming
    the file (exit 2), never a traceback nor an empty table reported as success."""
    path = tmp_path / "comparison.json"
    path.write_bytes(content)
    code, out, err = run_cli(["compare", path], capsys)
    assert code == 2 and out == ""
    assert problem in _one_error_line(err, str(path))


def test_compare_html_of_a_malformed_comparison_leaves_no_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page is rendered whole before it is written: a malformed file writes nothing."""
    path = tmp_path / "comparison.json"
    path.write_text('{"tito": {"bf16": {"packed": {"tokens": 3}}}}', encoding="utf-8")
    page = tmp_path / "page.html"
    code, _, err = run_cli(["compare", path, "--html", page], capsys)
    assert code == 2
    _one_error_line(err, str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comparison.json"]


def test_show_html_write_failure_leaves_no_partial_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write that fails (disk full) is one line naming the page; neither a partial page nor a
    temporary file is left, and an earlier page at that path is kept whole."""
    path = write_samples(tmp_path / "s.jsonl", [synthetic_sample(0, 16)])
    page = tmp_path / "page.html"
    page.write_text("earlier page", encoding="utf-8")

    def disk_full(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("tito_agents.cli._files.os.replace", disk_full)
    code, out, err = run_cli(["show", path, "--html", page], capsys)
    assert code == 2 and out == ""
    assert "No space left" in _one_error_line(err, str(page))
    assert page.read_text(encoding="utf-8") == "earlier page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html", "s.jsonl"]


def test_stats_counts_nan_and_infinite_rewards_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NaN and infinite rewards (kept by Parquet) are counted as not finite; the distribution is
    of the finite ones, in text and in valid JSON, instead of a traceback from the histogram."""
    pytest.importorskip("pyarrow", reason="the columnar sinks need pyarrow")
    from tito_agents.sinks.files import RotatingFileSink

    samples = [synthetic_sample(i, 16) for i in range(20)]
    for i, sample in enumerate(samples):
        sample.reward = (math.nan if i % 2 else math.inf) if i % 5 == 0 else i / 7
    sink = RotatingFileSink(tmp_path / "s.parquet")
    sink.write(samples)
    sink.close()
    finite = [i / 7 for i in range(20) if i % 5]

    code, out, err = run_cli(["stats", tmp_path, "--json"], capsys)
    assert code == 0 and err == ""
    rewards = json.loads(out)["rewards"]
    assert rewards["count"] == 20 and rewards["non_finite"] == 4
    assert rewards["mean"] == pytest.approx(sum(finite) / len(finite))
    assert (rewards["min"], rewards["max"]) == (pytest.approx(1 / 7), pytest.approx(19 / 7))
    assert sum(rewards["histogram"]["counts"]) == len(finite)

    code, out, err = run_cli(["stats", tmp_path], capsys)
    assert code == 0 and err == ""
    assert "20 set, 0 unset, 4 not finite" in out and " nan" not in out
