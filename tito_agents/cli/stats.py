"""`tito-agents stats`: what a samples file holds, in one streamed pass.

Episodes, samples (per-call and merged), calls, tokens, trained fraction, samples per episode,
divergences by kind (each divergence starts exactly one merged sample, so they are counted from
`start_reason`), start and end reasons, reward distribution. Per-sample work is a few counter updates
and one vectorised `np.count_nonzero` over the loss mask, so a scan runs at the reader's speed; memory
holds one number per sample (its reward and length) and one counter per episode, never token arrays.
A file written with `assembly="both"` holds every call twice; calls, tokens and rewards count each
agent's calls once (see `SampleStats`). Grammar-constrained calls (`CallSpan.constrained`) are counted.
"""

from __future__ import annotations

import argparse
import sys
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tito_agents.assembly.divergence import EPISODE_START, DivergenceKind
from tito_agents.cli import _sampling
from tito_agents.cli._errors import EXIT_OK, CliInputError
from tito_agents.cli._progress import Progress, progress_enabled
from tito_agents.cli._samples_file import open_samples_file
from tito_agents.cli._term import human_bytes, percent, table
from tito_agents.samples import Sample
from tito_agents.sinks.reading import SampleSource

__all__ = ["SampleStats", "add_parser", "collect_stats", "run"]

DIVERGENCE_KINDS = frozenset(k.value for k in DivergenceKind)
_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
_HISTOGRAM_BINS = 10
_DISTINCT_REWARDS_SHOWN = 8


@dataclass(slots=True)
class _View:
    """Calls, tokens, rewards and constrained sampling of a set of samples.

    Constraint fields: `CallSpan.constrained`, `logprob_source`, `rescore_error`.
    """

    samples: int = 0
    calls: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    rewards: array[float] = field(default_factory=lambda: array("d"))
    constrained_calls: int = 0
    constrained_tokens: int = 0
    constrained_kinds: Counter[str] = field(default_factory=Counter)
    logprob_sources: Counter[str] = field(default_factory=Counter)
    rescore_errors: int = 0
    sampling: _sampling.SamplingCounts = field(default_factory=_sampling.SamplingCounts)

    def add(self, sample: Sample, trained: int) -> None:
        self.samples += 1
        self.calls += len(sample.spans) or len(sample.call_ids)
        self.tokens += sample.token_ids.shape[0]
        self.trained_tokens += trained
        if sample.reward is not None:
            self.rewards.append(float(sample.reward))
        self.sampling.add(sample.spans)
        for span in sample.spans:
            kind = span.constrained
            if not kind:
                continue
            self.constrained_calls += 1
            self.constrained_kinds[str(kind)] += 1
            mask = sample.loss_mask[span.start : span.end]
            self.constrained_tokens += int(np.count_nonzero(mask))
            source = span.logprob_source
            self.logprob_sources[str(source) if source else "none"] += 1
            self.rescore_errors += bool(span.rescore_error)

    def absorb(self, other: _View) -> None:
        """Add `other`'s totals to these."""
        self.samples += other.samples
        self.calls += other.calls
        self.tokens += other.tokens
        self.trained_tokens += other.trained_tokens
        self.rewards.extend(other.rewards)
        self.constrained_calls += other.constrained_calls
        self.constrained_tokens += other.constrained_tokens
        self.constrained_kinds.update(other.constrained_kinds)
        self.logprob_sources.update(other.logprob_sources)
        self.rescore_errors += other.rescore_errors
        self.sampling.absorb(other.sampling)

    def constrained(self) -> dict[str, Any]:
        return {
            "calls": self.constrained_calls,
            "trained_tokens": self.constrained_tokens,
            "kinds": dict(self.constrained_kinds.most_common()),
            "spans_rescored": self.logprob_sources.get("rescored", 0),
            "spans_masked": self.logprob_sources.get("masked", 0),
            "rescore_errors": self.rescore_errors,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "calls": self.calls,
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "rewards": _reward_summary(self.rewards, self.samples),
            "constrained": self.constrained(),
            "sampling": self.sampling.to_dict(),
        }


@dataclass(slots=True)
class SampleStats:
    """Running totals over a stream of samples; `add` is the only per-sample work.

    A file written with `assembly="both"` holds each call twice: in a per-call sample and in a
    merged one (`Sample.view` says which). Calls, tokens, trained tokens, rewards and constrained
    sampling are therefore counted once per agent of an episode: from its merged samples when it
    has both kinds, else from the kind it has (`views` keeps each kind's own totals). An episode's
    samples are contiguous, as every sink writes them; each run of one episode id is one episode.
    """

    samples: int = 0
    with_logprobs: int = 0
    counted: _View = field(default_factory=_View)
    views: dict[str, _View] = field(
        default_factory=lambda: {"per_call": _View(), "merged": _View()}
    )
    episodes_with_both: int = 0
    samples_per_episode: Counter[str] = field(default_factory=Counter)
    start_reasons: Counter[str] = field(default_factory=Counter)
    end_reasons: Counter[str] = field(default_factory=Counter)
    agents: Counter[str] = field(default_factory=Counter)
    lengths: array[int] = field(default_factory=lambda: array("q"))
    _episode: str | None = None
    _pending: dict[tuple[str | None, str], _View] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        """Count one sample."""
        if sample.episode_id != self._episode:
            self._flush()
            self._episode = sample.episode_id
        self.samples += 1
        self.lengths.append(sample.token_ids.shape[0])
        trained = int(np.count_nonzero(sample.loss_mask))
        kind = sample.view
        self._pending.setdefault((sample.agent, kind), _View()).add(sample, trained)
        if sample.logprobs is not None:
            self.with_logprobs += 1
        self.samples_per_episode[sample.episode_id] += 1
        self.start_reasons[sample.start_reason] += 1
        self.end_reasons[sample.end_reason] += 1
        self.agents["(none)" if sample.agent is None else sample.agent] += 1

    def _flush(self) -> None:
        """Count the finished episode once: each agent's merged samples when it has both kinds."""
        pending = self._pending
        both = False
        for (agent, kind), view in pending.items():
            self.views[kind].absorb(view)
            if kind == "per_call" and (agent, "merged") in pending:
                both = True
                continue  # the same calls as the agent's merged samples
            self.counted.absorb(view)
        self.episodes_with_both += both
        self._pending = {}

    def finish(self) -> SampleStats:
        """Count the last episode (call once the stream ends; `collect_stats` does)."""
        self._flush()
        self._episode = None
        return self

    @property
    def calls(self) -> int:
        return self.counted.calls

    @property
    def tokens(self) -> int:
        return self.counted.tokens

    @property
    def trained_tokens(self) -> int:
        return self.counted.trained_tokens

    def divergences_by_kind(self) -> dict[str, int]:
        """Divergences counted by the kind that started a merged sample."""
        return {k: n for k, n in sorted(self.start_reasons.items()) if k in DIVERGENCE_KINDS}

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (the `--json` output)."""
        self.finish()
        view = self.counted
        per_episode = np.fromiter(self.samples_per_episode.values(), dtype=np.int64)
        lengths = np.frombuffer(self.lengths, dtype=np.int64) if self.lengths else None
        summary: dict[str, Any] = {
            "episodes": len(self.samples_per_episode),
            "samples": self.samples,
            "per_call_samples": self.views["per_call"].samples,
            "merged_samples": self.views["merged"].samples,
            "merged_first_samples": self.start_reasons.get(EPISODE_START, 0),
            "episodes_with_both": self.episodes_with_both,
            "calls": view.calls,
            "tokens": view.tokens,
            "trained_tokens": view.trained_tokens,
            "trained_fraction": view.trained_tokens / view.tokens if view.tokens else 0.0,
            "samples_with_logprobs": self.with_logprobs,
            "samples_per_episode": _distribution(per_episode),
            "tokens_per_sample": _distribution(lengths),
            "divergences": sum(self.divergences_by_kind().values()),
            "divergences_by_kind": self.divergences_by_kind(),
            "start_reasons": dict(sorted(self.start_reasons.items())),
            "end_reasons": dict(sorted(self.end_reasons.items())),
            "agents": dict(self.agents.most_common()),
            "rewards": _reward_summary(view.rewards, view.samples),
            "constrained": view.constrained(),
            "sampling": view.sampling.to_dict(),
        }
        if self.episodes_with_both:
            summary["views"] = {k: v.to_dict() for k, v in self.views.items()}
        return summary


def collect_stats(samples: SampleSource, *, show_progress: bool = False) -> SampleStats:
    """Stream `samples` once and return the totals."""
    stats = SampleStats()
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
    if sampling["spans"] > sampling["unknown"]:
        rows.insert(4, ("truncated spans", sampling["truncated"], _sampling.detail(sampling)))
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
            'episode(s) (assembly="both"): calls, tokens and rewards above count them once '
            "(merged);",
            f"  per-call view: {pc['samples']:,} samples, {pc['tokens']:,} tokens, "
            f"{pc['trained_tokens']:,} trained",
            f"  merged view:   {mg['samples']:,} samples, {mg['tokens']:,} tokens, "
            f"{mg['trained_tokens']:,} trained",
        ]
    if constrained["kinds"]:
        lines.append("constraints:   " + _counts(constrained["kinds"]))
    if s["divergences_by_kind"]:
        lines += ["", "divergences by kind"]
        lines.append(table(("kind", "count"), list(s["divergences_by_kind"].items()), indent="  "))
    lines += ["", "start reasons: " + _counts(s["start_reasons"])]
    lines.append("end reasons:   " + _counts(s["end_reasons"]))
    if s["agents"] and list(s["agents"]) != ["(none)"]:
        lines.append("agents:        " + _counts(s["agents"]))
    lines += ["", _format_rewards(s["rewards"])]
    warnings = _sampling.warnings(sampling)
    lines += ["", *warnings] if warnings else []
    return "\n".join(lines)


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counter.items()) or "-"


def _distribution(values: np.ndarray[Any, Any] | None) -> dict[str, Any]:
    if values is None or values.size == 0:
        return {"min": 0, "mean": 0.0, "p50": 0, "p90": 0, "max": 0}
    return {
        "min": int(values.min()),
        "mean": float(values.mean()),
        "p50": float(np.median(values)),
        "p90": float(np.quantile(values, 0.9)),
        "max": int(values.max()),
    }


def _reward_summary(rewards: array[float], samples: int) -> dict[str, Any]:
    """Count, unset, then the distribution of the finite rewards; NaN and infinite rewards (a
    reward function's bug, kept by Parquet/Arrow) are counted in `non_finite`, not summarised."""
    every = np.frombuffer(rewards, dtype=np.float64) if rewards else np.zeros(0)
    finite = np.isfinite(every)
    values = every[finite]
    summary: dict[str, Any] = {"count": int(every.size), "unset": samples - int(every.size)}
    if values.size < every.size:
        summary["non_finite"] = int(every.size - values.size)
    if values.size == 0:
        return summary
    summary.update(
        mean=float(values.mean()),
        std=float(values.std()),
        min=float(values.min()),
        max=float(values.max()),
        quantiles={f"p{round(q * 100)}": float(np.quantile(values, q)) for q in _QUANTILES},
    )
    distinct, counts = np.unique(values, return_counts=True)
    if distinct.size <= _DISTINCT_REWARDS_SHOWN:
        summary["values"] = {repr(float(v)): int(c) for v, c in zip(distinct, counts, strict=True)}
    else:
        hist, edges = np.histogram(values, bins=_HISTOGRAM_BINS)
        summary["histogram"] = {
            "edges": [float(e) for e in edges],
            "counts": [int(c) for c in hist],
        }
    return summary


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
