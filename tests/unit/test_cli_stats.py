"""`tito-agents stats`: totals, divergences by kind, rewards, JSON output, streaming and progress."""

from __future__ import annotations

import dataclasses
import io
import json
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.support.call_factory import make_call
from tests.support.cli_samples import _sample, merged_episode, run_cli, write_samples
from tito_agents.cli._progress import Progress
from tito_agents.cli.stats import collect_stats
from tito_agents.samples import Sample
from tito_agents.sinks.jsonl import encode_sample
from tito_agents.sinks.reading import read_samples


def test_stats_json_counts_what_the_file_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Episodes, samples, calls, tokens, trained fraction and reasons equal the samples' own figures."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    code, out, err = run_cli(["stats", path, "--json"], capsys)
    assert code == 0 and err == ""
    data = json.loads(out)
    tokens = sum(s.num_tokens for s in samples)
    trained = sum(s.num_trained for s in samples)
    assert data["episodes"] == len({s.episode_id for s in samples})
    assert data["samples"] == len(samples)
    assert data["per_call_samples"] == sum(s.start_reason == "call" for s in samples)
    assert data["calls"] == sum(len(s.spans) for s in samples)
    assert data["tokens"] == tokens and data["trained_tokens"] == trained
    assert data["trained_fraction"] == pytest.approx(trained / tokens)
    assert data["start_reasons"] == dict(Counter(s.start_reason for s in samples))
    assert data["end_reasons"] == dict(Counter(s.end_reason for s in samples))
    assert data["samples_with_logprobs"] == sum(s.logprobs is not None for s in samples)
    per_episode = Counter(s.episode_id for s in samples)
    assert data["samples_per_episode"]["max"] == max(per_episode.values())
    assert data["samples_per_episode"]["mean"] == pytest.approx(len(samples) / len(per_episode))


def test_divergences_are_counted_once_by_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each divergence starts one merged sample: kinds come from start reasons, never doubled by
    the end reason of the sample it left."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    _, out, _ = run_cli(["stats", path, "--json"], capsys)
    data = json.loads(out)
    assert data["divergences_by_kind"] == {"resample": 1, "template_rerender": 1}
    assert data["divergences"] == 2


def test_reward_distribution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rewards: how many are set, their mean, extremes, quantiles and value counts."""
    samples = merged_episode()
    rewards = np.array([s.reward for s in samples if s.reward is not None])
    path = write_samples(tmp_path / "s.jsonl", samples)
    _, out, _ = run_cli(["stats", path, "--json"], capsys)
    summary = json.loads(out)["rewards"]
    assert summary["count"] == rewards.size and summary["unset"] == len(samples) - rewards.size
    assert summary["mean"] == pytest.approx(rewards.mean())
    assert (summary["min"], summary["max"]) == (rewards.min(), rewards.max())
    assert summary["quantiles"]["p50"] == pytest.approx(np.median(rewards))
    assert sum(summary["values"].values()) == rewards.size


def test_many_distinct_rewards_get_a_histogram(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Continuous rewards are summarised as a 10-bin histogram that counts every reward once."""
    samples = [
        _sample(
            f"s{i}",
            f"e{i // 3}",
            None,
            [1, 2, 3],
            [(f"c{i}", 0, 2, 3, "stop", None)],
            reward=i / 7,
            start_reason="call",
            end_reason="stop",
        )
        for i in range(40)
    ]
    path = write_samples(tmp_path / "s.jsonl", samples)
    _, out, _ = run_cli(["stats", path, "--json"], capsys)
    histogram = json.loads(out)["rewards"]["histogram"]
    assert len(histogram["counts"]) == 10 and sum(histogram["counts"]) == 40
    _, text, _ = run_cli(["stats", path], capsys)
    assert "rewards: 40 set, 0 unset" in text


def test_text_output_names_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table shows episodes, samples, trained share, divergences by kind and rewards."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    code, out, _ = run_cli(["stats", path], capsys)
    assert code == 0
    trained = sum(s.num_trained for s in samples) / sum(s.num_tokens for s in samples)
    for needle in (
        "episodes",
        "samples per episode",
        "trained tokens",
        f"{100 * trained:.1f}%",
        "template_rerender",
        "resample",
        "rewards: 4 set, 1 unset",
    ):
        assert needle in out, needle


def test_empty_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty samples file is not a summary of zeros: exit 2 with one line saying it is empty
    (drift alike: test_cli_drift, which has the tokenizer drift needs)."""
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    code, out, err = run_cli(["stats", path, "--json"], capsys)
    assert code == 2 and out == ""
    assert "holds no samples" in err and str(path) in err


def _both_views() -> tuple[list[Sample], list[Sample]]:
    """Two episodes assembled for real with assembly="both" (per-call samples, then merged ones),
    each with two calls of one agent, and a one-call episode of a second agent in merged mode only."""
    from tito_agents.assembly import (
        AssemblyMode,
        AssemblyOptions,
        EpisodeContext,
        assemble,
    )
    from tito_agents.calls import Call

    def call(cid: str, prompt: list[int], sampled: list[int], reward: float | None) -> Call:
        return make_call(cid, prompt, sampled, request_id=cid, agent="solver", reward=reward)

    both: list[Sample] = []
    for e in range(2):
        first = call(f"e{e}/a", [1, 2, 3], [10, 11], 0.5)
        second = call(f"e{e}/b", [1, 2, 3, 10, 11, 20, 21], [12, 13, 14], 1.0)
        both += assemble(
            [first, second],
            EpisodeContext(f"ep{e}", episode_reward=None),
            AssemblyOptions(mode=AssemblyMode.BOTH),
        )[0]
    merged_only, _ = assemble(
        [call("x/a", [5, 6], [7], 2.0)],
        EpisodeContext("ep-x", episode_reward=None),
        AssemblyOptions(mode=AssemblyMode.MERGED),
    )
    return both, merged_only


def test_both_assembly_counts_each_call_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file written with assembly="both" holds each call in a per-call and in a merged sample:
    calls, tokens, trained tokens and rewards count each call once (the merged view), and each
    view's own totals are listed beside them."""
    both, merged_only = _both_views()
    assert {s.start_reason for s in both} == {"call", "episode_start"}
    path = write_samples(tmp_path / "s.jsonl", [*both, *merged_only])
    code, out, _ = run_cli(["stats", path, "--json"], capsys)
    data = json.loads(out)
    merged = [s for s in [*both, *merged_only] if s.start_reason != "call"]
    per_call = [s for s in both if s.start_reason == "call"]
    assert code == 0 and data["samples"] == len(both) + len(merged_only)
    assert data["calls"] == 5 == sum(len(s.spans) for s in merged)
    assert data["tokens"] == sum(s.num_tokens for s in merged)
    assert data["trained_tokens"] == sum(s.num_trained for s in merged) == 2 * 5 + 1
    assert data["rewards"]["count"] == len(merged)
    assert data["episodes_with_both"] == 2
    assert data["views"]["per_call"]["calls"] == 4 == len(per_call)
    assert data["views"]["per_call"]["tokens"] == sum(s.num_tokens for s in per_call)
    assert data["views"]["merged"]["samples"] == len(merged)
    _, text, _ = run_cli(["stats", path], capsys)
    assert 'assembly="both"' in text and "per-call view: 4 samples" in text


def test_both_assembly_never_mixes_the_views_in_averages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The per-sample and per-episode figures count the same view as the totals (the merged one
    where an episode has both): tokens per sample is tokens over the counted samples, and each
    view's own averages are its own."""
    both, merged_only = _both_views()
    path = write_samples(tmp_path / "s.jsonl", [*both, *merged_only])
    code, out, _ = run_cli(["stats", path, "--json"], capsys)
    data = json.loads(out)
    merged = [s for s in [*both, *merged_only] if s.start_reason != "call"]
    per_call = [s for s in both if s.start_reason == "call"]
    assert code == 0
    assert data["tokens_per_sample"]["mean"] == pytest.approx(data["tokens"] / len(merged))
    assert data["samples_per_episode"]["mean"] == pytest.approx(len(merged) / 3)
    per_call_view = data["views"]["per_call"]
    assert per_call_view["tokens_per_sample"]["mean"] == pytest.approx(
        sum(s.num_tokens for s in per_call) / len(per_call)
    )
    assert per_call_view["samples_per_episode"]["mean"] == pytest.approx(len(per_call) / 2)
    _, text, _ = run_cli(["stats", path], capsys)
    assert "per-call view: 4 samples (2 per episode)" in text


def test_constrained_spans_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Spans sampled under a constraint are counted: calls, their trained tokens, kinds, and how
    many were re-scored or keep only the masked logprobs; files without the fields count none."""
    samples = merged_episode()
    a = samples[0]
    a.spans[0] = dataclasses.replace(
        a.spans[0], constrained="tool_choice=required", logprob_source="rescored"
    )
    d = samples[3]
    d.spans[0] = dataclasses.replace(
        d.spans[0],
        constrained="response_format=json_schema",
        logprob_source="masked",
        rescore_error="server refused prompt_logprobs",
    )
    path = write_samples(tmp_path / "s.jsonl", samples)
    _, out, _ = run_cli(["stats", path, "--json"], capsys)
    constrained = json.loads(out)["constrained"]
    spans = (a.spans[0], d.spans[0])
    assert constrained == {
        "calls": 2,
        "trained_tokens": sum(s.end - s.start for s in spans),
        "kinds": {"tool_choice=required": 1, "response_format=json_schema": 1},
        "spans_rescored": 1,
        "spans_masked": 1,
        "rescore_errors": 1,
    }
    _, text, _ = run_cli(["stats", path], capsys)
    assert "constrained calls" in text and "1 spans rescored, 1 masked logprobs only" in text
    plain = write_samples(tmp_path / "plain.jsonl", merged_episode())
    _, out, _ = run_cli(["stats", plain, "--json"], capsys)
    assert json.loads(out)["constrained"]["calls"] == 0
    _, text, _ = run_cli(["stats", plain], capsys)
    assert "constrained calls" not in text and "constraints:" not in text


def _big_sample(i: int, n: int) -> Sample:
    rng = np.random.default_rng(i)
    ids = rng.integers(0, 50_000, size=n).tolist()
    return _sample(
        f"s{i}",
        f"e{i // 4}",
        "a",
        ids,
        [(f"c{i}", 0, n // 2, n, "stop", None)],
        reward=float(i % 2),
        start_reason="call",
        end_reason="stop",
    )


def _peak_scan_memory(path: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        stats = collect_stats(read_samples(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return stats.samples, peak


def test_scan_streams_without_holding_the_file(tmp_path: Path) -> None:
    """Peak Python memory of a scan does not grow with the file: three times the samples, about
    the same peak, far below the file size."""
    peaks = {}
    for count in (40, 120):
        path = tmp_path / f"big{count}.jsonl"
        with open(path, "wb") as handle:
            for i in range(count):
                handle.write(encode_sample(_big_sample(i, 4096)))
        scanned, peaks[count] = _peak_scan_memory(path)
        assert scanned == count
    size = (tmp_path / "big120.jsonl").stat().st_size
    assert peaks[120] < 1.5 * peaks[40], peaks
    assert peaks[120] < size / 3, f"peak {peaks[120]:,} bytes for a {size:,}-byte file"


def test_progress_line_counts_samples_against_the_estimate() -> None:
    """The progress line shows the bar, the share done and a `~` total when it is an estimate."""
    stream = io.StringIO()
    progress = Progress("stats", enabled=True, total=200, estimated=True, stream=stream)
    for _ in range(50):
        progress.advance(tokens=10)
    line = progress.render()
    assert "50/~200" in line and "25%" in line and "500 tokens" in line
    for _ in range(300):
        progress.advance()
    assert "99%" in progress.render()  # an estimate never claims completion


def test_progress_draws_only_when_enabled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --progress and without a terminal nothing is drawn on stderr; --progress draws and
    then clears its line."""
    samples = [
        _sample(
            f"s{i}",
            "e",
            None,
            [1, 2],
            [(f"c{i}", 0, 1, 2, "stop", None)],
            reward=None,
            start_reason="call",
            end_reason="stop",
        )
        for i in range(3000)
    ]
    path = write_samples(tmp_path / "s.jsonl", samples)
    _, _, err = run_cli(["stats", path, "--json"], capsys)
    assert err == ""
    stream = io.StringIO()
    progress = Progress("stats", enabled=True, total=3000, stream=stream)
    progress._last_draw = -1e9  # draw at the first check
    for _ in range(64):
        progress.advance(2)
    progress.close()
    assert "stats [" in stream.getvalue() and stream.getvalue().endswith("\r\x1b[2K")
