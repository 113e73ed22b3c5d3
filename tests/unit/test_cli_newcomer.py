"""What a newcomer runs first: `--version`, every subcommand documented, the path given to
`Collector` opened by every command whatever the file sink wrote for it, a `--chat-template` that
is not a chat template refused, and `show` finding a sample without parsing the rest of the file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.cli_samples import merged_episode, run_cli, write_samples
from tito_agents import __version__
from tito_agents.cli._errors import CliInputError
from tito_agents.cli.main import build_parser
from tito_agents.cli.show import find_sample, locate
from tito_agents.samples import Sample
from tito_agents.sinks.jsonl import encode_sample
from tito_agents.sinks.reading import read_samples
from tito_agents.testing.smollm2 import TOOLS_TEMPLATE_PATH, tokenizer_dir

pytest.importorskip("pyarrow", reason="the columnar sinks need pyarrow")

from tito_agents.sinks.files import RotatingFileSink

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`tito-agents --version` prints the version and exits 0."""
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"tito-agents {__version__}"


def test_every_subcommand_has_a_section_in_the_docs() -> None:
    """docs/cli.md covers every subcommand the parser has (one `## \\`name\\`` section each)."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    text = DOCS.read_text(encoding="utf-8")
    missing = [name for name in commands if f"## `{name}`" not in text]
    assert missing == []
    assert len(commands) == 6


def _parts(folder: Path, suffix: str, samples: list[Sample]) -> Path:
    """What `Collector(folder / "samples<suffix>")` leaves: finished rotating parts."""
    sink = RotatingFileSink(folder / f"samples{suffix}", max_file_samples=2)
    for sample in samples:
        sink.write([sample])
    sink.close()
    return folder / f"samples{suffix}"


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_the_collector_path_opens_its_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    """`stats out/samples.parquet` reads the parts a rotating sink wrote for that path (also
    given as a `file://` URL or with sink options), and counts each call once."""
    samples = merged_episode()
    path = _parts(tmp_path, suffix, samples)
    assert not path.exists() and len(list(tmp_path.iterdir())) == 3
    for spec in (str(path), f"file://{path}", f"{path}?max_file_samples=2"):
        code, out, err = run_cli(["stats", spec, "--json"], capsys)
        assert code == 0 and err == "", err
        data = json.loads(out)
        assert data["samples"] == 5 and data["merged_samples"] == 4
    code, out, _ = run_cli(["show", path, "--index", "3", "--json"], capsys)
    assert code == 0 and json.loads(out)["sample_id"] == samples[3].sample_id


def test_parts_still_being_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only in-progress parts: refused with what is going on and how to read them anyway; with
    finished parts beside them, those are read and the others are named in a warning."""
    samples = merged_episode()
    sink = RotatingFileSink(tmp_path / "samples.arrow")
    sink.write(samples[:2])
    try:
        code, _, err = run_cli(["stats", tmp_path / "samples.arrow"], capsys)
        assert code == 2 and "still being written" in err and "--allow-truncated" in err
        code, out, _ = run_cli(
            ["stats", tmp_path / "samples.arrow", "--json", "--allow-truncated"], capsys
        )
        assert code == 0 and json.loads(out)["samples"] == 2
    finally:
        sink.close()
    sink = RotatingFileSink(tmp_path / "samples.arrow")
    sink.write(samples[2:])
    try:
        code, out, err = run_cli(["stats", tmp_path / "samples.arrow", "--json"], capsys)
        assert code == 0 and json.loads(out)["samples"] == 2
        assert "1 part(s) still being written are left out" in err
    finally:
        sink.close()


def test_a_path_with_nothing_behind_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["stats", tmp_path / "samples.parquet"], capsys)
    assert code == 2 and "no such file, and no parts a file sink wrote for it" in err
    assert "samples-<run>-<index>.parquet" in err


def _drift(path: Path, template: Path | str, capsys: pytest.CaptureFixture[str]) -> Any:
    return run_cli(
        ["drift", path, "--tokenizer", tokenizer_dir(), "--chat-template", template, "--json"],
        capsys,
    )


def test_drift_refuses_a_file_that_is_not_a_chat_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An HTML page compiles as Jinja (it is all text), so compiling proves nothing: a template
    that renders no conversation is refused with exit 2, as `audit-template` refuses it."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    page = tmp_path / "page.html"
    page.write_text("<html><body><h1>Release notes</h1><p>Nothing here.</p></body></html>\n")
    code, out, err = _drift(path, page, capsys)
    assert code == 2 and out == ""
    assert str(page) in err and "renders no conversation" in err
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ messages }}"}))
    code, _, err = _drift(path, config, capsys)
    assert code == 2 and "tokenizer config" in err
    code, out, _ = _drift(path, TOOLS_TEMPLATE_PATH, capsys)
    assert code == 0 and json.loads(out)["chat_template"] == str(TOOLS_TEMPLATE_PATH)
    code, out, _ = _drift(path, tokenizer_dir(), capsys)  # a tokenizer folder: its template
    assert code == 0 and json.loads(out)["chat_template"] == str(tokenizer_dir())


def _mixed_file(tmp_path: Path) -> tuple[Path, list[Sample]]:
    """Two copies of the hand-built episodes under other episode ids, as the sinks write them, as
    files written before `view` existed, and in another key order (parsed whole)."""
    samples = []
    lines = []
    for copy, layout in enumerate(("sink", "old", "reordered")):
        for sample in merged_episode():
            data = orjson.loads(encode_sample(sample))
            data["episode_id"] = f"{sample.episode_id}-{copy}"
            data["sample_id"] = f"{copy}{sample.sample_id}"
            if layout == "old":
                del data["view"]
            if layout == "reordered":
                data = dict(reversed(list(data.items())))
            lines.append(orjson.dumps(data) + b"\n")
            samples.append(Sample.from_dict(data))
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join(lines))
    return path, samples


def test_show_finds_the_same_sample_and_siblings_as_a_full_read(tmp_path: Path) -> None:
    """The line-peeking search gives the sample and the merged siblings a full parse gives, for
    every index and for ids and unique prefixes, whatever the line layout."""
    path, samples = _mixed_file(tmp_path)
    opened = read_samples(path)
    for index in range(len(samples)):
        target, episode = locate(opened, index=index)
        full, full_episode, _ = find_sample(iter(samples), index=index)
        assert target.sample_id == full.sample_id
        merged = [s.sample_id for s in full_episode if s.view == "merged" or s is full]
        assert [s.sample_id for s in episode] == merged
        assert target.token_ids.tolist() == full.token_ids.tolist()
    target, _ = locate(opened, sample_id="2" + "C" * 24)
    assert target.sample_id == "2" + "C" * 24
    target, episode = locate(opened, sample_id="1DDD")  # a unique prefix
    assert target.sample_id == "1" + "D" * 24
    assert [s.sample_id for s in episode] == ["1" + c * 24 for c in "ABCD"]
    with pytest.raises(CliInputError, match="ambiguous"):
        locate(opened, sample_id="1")


def test_show_index_parses_only_what_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show --index N` on per-call samples builds one sample, not N (7 s and more on a large file)."""
    from tito_agents.sinks.harness import synthetic_sample

    path = write_samples(tmp_path / "big.jsonl", [synthetic_sample(i) for i in range(400)])
    built: list[str] = []
    original = Sample.from_dict.__func__  # type: ignore[attr-defined]

    def counting(cls: type[Sample], data: Any) -> Sample:
        sample = original(cls, data)
        built.append(sample.sample_id)
        return sample

    monkeypatch.setattr(Sample, "from_dict", classmethod(counting))
    code, out, _ = run_cli(["show", path, "--index", "377", "--json"], capsys)
    assert code == 0 and json.loads(out)["sample_id"] == synthetic_sample(377).sample_id
    assert built == [synthetic_sample(377).sample_id]


def test_a_folder_without_a_tokenizer_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tokenizer DIR` given a folder with no tokenizer files: one line saying so (exit 2), not
    transformers' message about sentencepiece."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    empty = tmp_path / "model"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    for argv in (["drift", path, "--tokenizer", empty], ["show", path, "--tokenizer", empty]):
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and f"no tokenizer.json in {empty}" in err
        assert "sentencepiece" not in err.lower()


def test_show_index_counts_from_the_end_when_negative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`show --index -1` is the last sample, as in Python; past the start it is refused."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    for index, want in ((-1, samples[-1]), (-len(samples), samples[0])):
        code, out, _ = run_cli(["show", path, "--index", str(index), "--json"], capsys)
        assert code == 0 and json.loads(out)["sample_id"] == want.sample_id
    code, _, err = run_cli(["show", path, "--index", str(-len(samples) - 1)], capsys)
    assert code == 2 and f"no sample #{-len(samples) - 1} among {len(samples)} samples" in err


def test_compare_says_how_to_produce_its_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compare` given a samples file, or a missing file, says what it reads and how to make it."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    one = write_samples(tmp_path / "one.jsonl", merged_episode()[:1])
    for given, what in (
        (path, "JSON Lines: a samples file?"),
        (one, "a samples file, not a comparison"),
        (tmp_path / "comparison.json", "no such file"),
    ):
        code, out, err = run_cli(["compare", given], capsys)
        assert code == 2 and out == "" and what in err
        assert "make rl-step" in err and ".to_dict() as JSON" in err
