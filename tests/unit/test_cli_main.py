"""The command's contract for bad input: one line naming the file and problem, exit code 2, no
traceback unless --debug; and `python -m tito_agents.cli` works without the console script."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_samples import TEMPLATES, merged_episode, run_cli, write_samples
from tito_agents.cli._errors import EXIT_BAD_INPUT
from tito_agents.cli.main import main
from tito_agents.errors import SampleFormatError


def _assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tito-agents: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def _torn(tmp_path: Path) -> Path:
    path = write_samples(tmp_path / "torn.jsonl", merged_episode())
    path.write_bytes(path.read_bytes()[:-5])
    return path


@pytest.mark.parametrize("command", ["stats", "show"])
def test_not_a_samples_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A file that is not a samples file: one line naming it and saying so."""
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n")
    code, out, err = run_cli([command, path], capsys)
    _assert_one_line_error(code, out, err, str(path), "not a samples file")


@pytest.mark.parametrize("command", ["stats", "show"])
def test_truncated_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """A torn last line: one line naming the file and the truncation, and how to proceed."""
    path = _torn(tmp_path)
    code, out, err = run_cli([command, path], capsys)
    _assert_one_line_error(code, out, err, str(path), "truncated", "--allow-truncated")


def test_allow_truncated_reports_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --allow-truncated the complete samples are reported and the skip is warned about."""
    path = _torn(tmp_path)
    code, out, err = run_cli(["stats", path, "--json", "--allow-truncated"], capsys)
    assert code == 0 and '"samples": 4' in out
    assert "torn last line" in err and "Traceback" not in err


def test_corrupt_middle_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Corruption before the last line: one line with the file and line number."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:40]
    path.write_bytes(b"\n".join(lines))
    code, out, err = run_cli(["stats", path], capsys)
    _assert_one_line_error(code, out, err, f"{path}:2", "not JSON")


def test_compressed_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A gzip file and a missing file are named with their problem."""
    path = tmp_path / "s.jsonl.gz"
    path.write_bytes(gzip.compress(b"{}\n"))
    _assert_one_line_error(*run_cli(["stats", path], capsys), str(path), "gzip")
    _assert_one_line_error(*run_cli(["stats", tmp_path / "nope"], capsys), "nope", "no such file")


def test_template_that_fails_to_render(capsys: pytest.CaptureFixture[str]) -> None:
    """A template that raises for every conversation: one line with the template's own message."""
    path = TEMPLATES / "refuses_everything.jinja"
    code, out, err = run_cli(["audit-template", path], capsys)
    _assert_one_line_error(
        code, out, err, str(path), "fails to render", "this template renders no conversation"
    )


def test_template_that_does_not_compile(capsys: pytest.CaptureFixture[str]) -> None:
    """A Jinja syntax error: one line with the file, the line number and the parser's message."""
    path = TEMPLATES / "broken_syntax.jinja"
    code, out, err = run_cli(["audit-template", path], capsys)
    _assert_one_line_error(code, out, err, str(path), "does not compile (line 2)")


def test_tokenizer_that_cannot_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tokenizer folder with a broken tokenizer.json, a corrupt GGUF and a missing path: each one
    line naming the tokenizer."""
    samples = write_samples(tmp_path / "s.jsonl", merged_episode())
    broken = tmp_path / "broken-tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{ not json")
    (broken / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    code, out, err = run_cli(["drift", samples, "--tokenizer", broken], capsys)
    _assert_one_line_error(code, out, err, str(broken), "cannot load tokenizer")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    code, out, err = run_cli(["audit-template", gguf], capsys)
    _assert_one_line_error(code, out, err, str(gguf), "cannot load tokenizer")
    code, out, err = run_cli(["show", samples, "--tokenizer", tmp_path / "absent"], capsys)
    _assert_one_line_error(code, out, err, "absent", "tokenizer not found")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    """--debug (anywhere on the line) lets the error propagate with its traceback."""
    path = tmp_path / "notes.txt"
    path.write_text("notes\n")
    with pytest.raises(SampleFormatError, match="not a samples file"):
        main(["stats", str(path), "--debug"])


def test_module_entry_point_runs() -> None:
    """`python -m tito_agents.cli --help` lists every subcommand (no console script needed)."""
    result = subprocess.run(
        [sys.executable, "-m", "tito_agents.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for command in ("audit-template", "drift", "show", "stats"):
        assert command in result.stdout
