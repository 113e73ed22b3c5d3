"""`tito-agents stats`: what a samples file holds, in one streamed pass.

The counting is the library's `tito_agents.assembly.report.SamplesSummary` (episodes, samples,
calls, tokens, trained fraction, distributions, divergences by kind from `start_reason`, reasons,
rewards, constrained and tempered/truncated sampling; with `assembly="both"` each call counted in
one view). Per-sample work is a few counter updates and one vectorised `np.count_nonzero` over
the loss mask, so a scan runs at the reader's speed. This module prints it, as a table or JSON.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from tito_agents.assembly import sampling_report
from tito_agents.assembly.report import SamplesSummary
from tito_agents.cli._errors import EXIT_OK, CliInputError
from tito_agents.cli._progress import Progress, progress_enabled
from tito_agents.cli._samples_file import open_samples_file
from tito_agents.cli._term import human_bytes, percent, table
from tito_agents.sinks.reading import SampleSource

__all__ = ["add_parser", "collect_stats", "run"]


def collect_stats(samples: SampleSource, *, show_progress: bool = False) -> SamplesSummary:
    """Stream `samples` once and return the totals."""
    stats = SamplesSummary()
    with Progress(
        "stats",
        enabled=show_progress,
        total=samples.estimated_samples,
        estimated=not samples.count_is_exact,
    ) as progress:
        for sample in samples:
            stats.add(sample)
            progress.advance(sample.token_ids.shape[0])
    return stats.finish()


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stats",
        help="episodes, samples, tokens, trained fraction, divergences, rewards of a samples file",
        description="Summarise a samples file in one streamed pass.",
    )
    parser.add_argument(
        "samples_file",
        help="a samples file written by any sink (JSONL, Parquet, ...), or a folder of them",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--progress", action="store_true", help="draw progress even when not a TTY")
    parser.add_argument(
        "--allow-truncated", action="store_true", help="skip a torn last line instead of failing"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    samples = open_samples_file(args.samples_file, allow_truncated=args.allow_truncated)
    stats = collect_stats(samples, show_progress=progress_enabled(args.progress))
    if stats.samples == 0:
        raise CliInputError(
            samples.path, "holds no samples (an empty file: did the run write anything yet?)"
        )
    summary = stats.to_dict()
    if args.json:
        summary = {"file": str(samples.path), "format": samples.format, **summary}
        if samples.parts:
            summary["parts"] = [str(p) for p in samples.parts]
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(format_stats(summary, samples) + "\n")
    return EXIT_OK


def format_stats(summary: dict[str, Any], samples: SampleSource) -> str:
    """The human-readable summary."""
    s = summary
    per_ep = s["samples_per_episode"]
    lengths = s["tokens_per_sample"]
    rows: list[tuple[str, object, str]] = [
        ("episodes", s["episodes"], ""),
        (
            "samples",
            s["samples"],
            f"per-call {s['per_call_samples']:,}, merged {s['merged_samples']:,}",
        ),
        (
            "samples per episode",
            per_ep["mean"],
            f"min {per_ep['min']}, median {per_ep['p50']:g}, max {per_ep['max']}",
        ),
        ("calls", s["calls"], ""),
        (
            "tokens",
            s["tokens"],
            f"per sample: mean {lengths['mean']:,.0f}, min {lengths['min']}, max {lengths['max']}",
        ),
        ("trained tokens", s["trained_tokens"], percent(s["trained_tokens"], s["tokens"])),
        (
            "samples with logprobs",
            s["samples_with_logprobs"],
            percent(s["samples_with_logprobs"], s["samples"]),
        ),
        ("divergences", s["divergences"], ""),
    ]
    constrained = s["constrained"]
    if constrained["calls"]:
        rows.insert(
            4,
            (
                "constrained calls",
                constrained["calls"],
                f"{constrained['trained_tokens']:,} trained tokens sampled under a constraint "
                f"({percent(constrained['trained_tokens'], s['trained_tokens'])}); "
                f"{constrained['spans_rescored']:,} spans rescored, "
                f"{constrained['spans_masked']:,} masked logprobs only"
                + (
                    f", {constrained['rescore_errors']:,} rescore errors"
                    if constrained["rescore_errors"]
                    else ""
                ),
            ),
        )
    sampling = s["sampling"]
    size = human_bytes(samples.size_bytes)
    what = (
        f"{_parts(len(samples.parts))} {samples.format}, "
        if samples.parts
        else f"{samples.format}, "
    )
    lines = [f"{samples.path} ({what}{size})", ""]
    lines.append(table(("", "value", "detail"), rows))
    if "views" in s:
        pc, mg = s["views"]["per_call"], s["views"]["merged"]
        lines += [
            "",
            f"per-call and merged samples of the same calls in {s['episodes_with_both']:,} "
            'episode(s) (assembly="both"): everything above but the sample count and the '
            "reasons counts the merged view there; each view on its own:",
            _view_line("per-call view:", pc),
            _view_line("merged view:  ", mg),
        ]
    if constrained["kinds"]:
        lines.append("constraints:   " + _counts(constrained["kinds"]))
    if sampling["spans"] > sampling["unknown"]:
        lines += ["", *sampling_report.describe(sampling)]
    if s["divergences_by_kind"]:
        lines += ["", "divergences by kind"]
        lines.append(table(("kind", "count"), list(s["divergences_by_kind"].items()), indent="  "))
    lines += ["", "start reasons: " + _counts(s["start_reasons"])]
    lines.append("end reasons:   " + _counts(s["end_reasons"]))
    if s["agents"] and list(s["agents"]) != ["(none)"]:
        lines.append("agents:        " + _counts(s["agents"]))
    lines += ["", _format_rewards(s["rewards"])]
    warnings = sampling_report.warnings(sampling)
    lines += ["", *warnings] if warnings else []
    return "\n".join(lines)


def _view_line(label: str, view: dict[str, Any]) -> str:
    per_ep, lengths = view["samples_per_episode"], view["tokens_per_sample"]
    return (
        f"  {label} {view['samples']:,} samples ({per_ep['mean']:.3g} per episode), "
        f"{view['tokens']:,} tokens ({lengths['mean']:,.0f} per sample), "
        f"{view['trained_tokens']:,} trained"
    )


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counter.items()) or "-"


def _format_rewards(rewards: dict[str, Any]) -> str:
    head = f"rewards: {rewards['count']:,} set, {rewards['unset']:,} unset"
    if rewards.get("non_finite"):
        head += f", {rewards['non_finite']:,} not finite (NaN or infinite; left out below)"
    if "mean" not in rewards:
        return head
    q = rewards["quantiles"]
    lines = [
        head,
        f"  mean {rewards['mean']:.4g}  std {rewards['std']:.4g}  min {rewards['min']:.4g}  "
        f"p10 {q['p10']:.4g}  p50 {q['p50']:.4g}  p90 {q['p90']:.4g}  max {rewards['max']:.4g}",
    ]
    if "values" in rewards:
        total = max(rewards["values"].values())
        for value, count in rewards["values"].items():
            lines.append(f"  {value:>10}  {_bar(count, total)} {count:,}")
    else:
        hist = rewards["histogram"]
        total = max(hist["counts"]) or 1
        edges = hist["edges"]
        for i, count in enumerate(hist["counts"]):
            label = (
                f"[{edges[i]:.3g}, {edges[i + 1]:.3g}{']' if i == len(hist['counts']) - 1 else ')'}"
            )
            lines.append(f"  {label:>20}  {_bar(count, total)} {count:,}")
    return "\n".join(lines)


def _bar(count: int, total: int, width: int = 30) -> str:
    filled = round(width * count / total) if total else 0
    return "█" * filled + " " * (width - filled)


def _parts(count: int) -> str:
    return "1 part" if count == 1 else f"{count:,} parts"
