"""Reports over samples: one counting code, two questions.

* `SamplesSummary` answers "what do these samples hold?" for samples already written (a file of
  any size, streamed): episodes, samples, calls, tokens, trained fraction, distributions, rewards,
  constrained and tempered/truncated sampling. `tito-agents stats` prints it. It holds one number
  per sample, never token arrays.
* `AssemblyReport` answers "what did assembling these episodes do?": the same counts (taken from a
  `SamplesSummary`) plus each divergence record with its position and excerpt, which exist only
  while assembling (a stored sample keeps only the kind, as its `start_reason`).

Kept apart from assembly itself: a report reads finished samples (of any mode, any number of
episodes) and never takes part in making them.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito_agents.assembly.divergence import EPISODE_START, Divergence, DivergenceKind
from tito_agents.assembly.sampling_report import SamplingCounts
from tito_agents.samples import Sample

__all__ = ["AssemblyReport", "SamplesSummary", "ViewTotals", "assembly_report"]

DIVERGENCE_KINDS = frozenset(k.value for k in DivergenceKind)
_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
_HISTOGRAM_BINS = 10
_DISTINCT_REWARDS_SHOWN = 8


@dataclass(slots=True)
class ViewTotals:
    """Calls, tokens, rewards, lengths and sampling of one set of samples (one view of the calls:
    per-call samples, merged samples, or the calls counted once)."""

    samples: int = 0
    calls: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    rewards: array[float] = field(default_factory=lambda: array("d"))
    lengths: array[int] = field(default_factory=lambda: array("q"))
    """Tokens per sample, one entry per sample."""
    episode_sizes: array[int] = field(default_factory=lambda: array("q"))
    """Samples per episode, one entry per episode that has samples of this set."""
    constrained_calls: int = 0
    constrained_tokens: int = 0
    constrained_kinds: Counter[str] = field(default_factory=Counter)
    logprob_sources: Counter[str] = field(default_factory=Counter)
    rescore_errors: int = 0
    sampling: SamplingCounts = field(default_factory=SamplingCounts)

    def add(self, sample: Sample, trained: int) -> None:
        self.samples += 1
        self.calls += len(sample.spans) or len(sample.call_ids)
        self.tokens += sample.token_ids.shape[0]
        self.lengths.append(sample.token_ids.shape[0])
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

    def absorb(self, other: ViewTotals) -> None:
        """Add `other`'s totals to these (episode sizes are added by the caller, per episode)."""
        self.samples += other.samples
        self.calls += other.calls
        self.tokens += other.tokens
        self.trained_tokens += other.trained_tokens
        self.rewards.extend(other.rewards)
        self.lengths.extend(other.lengths)
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
            "samples_per_episode": _distribution(self.episode_sizes),
            "tokens_per_sample": _distribution(self.lengths),
            "rewards": _reward_summary(self.rewards, self.samples),
            "constrained": self.constrained(),
            "sampling": self.sampling.to_dict(),
        }


@dataclass(slots=True)
class SamplesSummary:
    """Running totals over a stream of stored samples; `add` is the only per-sample work.

    A file written with `assembly="both"` holds each call twice: in a per-call sample and in a
    merged one (`Sample.view` says which). Everything that counts calls or tokens (calls, tokens,
    trained tokens, rewards, samples per episode, tokens per sample, constrained and sampling
    counts) is therefore taken from one view per agent of an episode: its merged samples when it
    has both kinds, else the kind it has (`counted`); `views` keeps each kind's own totals, never
    mixed with the other's. `samples` and the reasons count every sample as written. An episode's
    samples are contiguous, as every sink writes them; each run of one episode id is one episode.
    """

    samples: int = 0
    with_logprobs: int = 0
    counted: ViewTotals = field(default_factory=ViewTotals)
    views: dict[str, ViewTotals] = field(
        default_factory=lambda: {"per_call": ViewTotals(), "merged": ViewTotals()}
    )
    episodes_with_both: int = 0
    episode_ids: Counter[str] = field(default_factory=Counter)
    start_reasons: Counter[str] = field(default_factory=Counter)
    end_reasons: Counter[str] = field(default_factory=Counter)
    agents: Counter[str] = field(default_factory=Counter)
    _episode: str | None = None
    _pending: dict[tuple[str | None, str], ViewTotals] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        """Count one sample."""
        if sample.episode_id != self._episode:
            self._flush()
            self._episode = sample.episode_id
        self.samples += 1
        trained = int(np.count_nonzero(sample.loss_mask))
        self._pending.setdefault((sample.agent, sample.view), ViewTotals()).add(sample, trained)
        if sample.logprobs is not None:
            self.with_logprobs += 1
        self.episode_ids[sample.episode_id] += 1
        self.start_reasons[sample.start_reason] += 1
        self.end_reasons[sample.end_reason] += 1
        self.agents["(none)" if sample.agent is None else sample.agent] += 1

    def _flush(self) -> None:
        """Count the finished episode once: each agent's merged samples when it has both kinds."""
        pending = self._pending
        both = False
        counted = 0
        per_kind: Counter[str] = Counter()
        for (agent, kind), view in pending.items():
            self.views[kind].absorb(view)
            per_kind[kind] += view.samples
            if kind == "per_call" and (agent, "merged") in pending:
                both = True
                continue  # the same calls as the agent's merged samples
            self.counted.absorb(view)
            counted += view.samples
        if counted:
            self.counted.episode_sizes.append(counted)
        for kind, n in per_kind.items():
            self.views[kind].episode_sizes.append(n)
        self.episodes_with_both += both
        self._pending = {}

    def finish(self) -> SamplesSummary:
        """Count the last episode (call once the stream ends)."""
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
        """The summary as JSON-ready data (`tito-agents stats --json`)."""
        self.finish()
        view = self.counted
        summary: dict[str, Any] = {
            "episodes": len(self.episode_ids),
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
            "samples_per_episode": _distribution(view.episode_sizes),
            "tokens_per_sample": _distribution(view.lengths),
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


def summarize(samples: Iterable[Sample]) -> SamplesSummary:
    """The summary of `samples`, streamed once."""
    summary = SamplesSummary()
    for sample in samples:
        summary.add(sample)
    return summary.finish()


@dataclass(slots=True)
class AssemblyReport:
    """What assembling some episodes gave: the counts of a `SamplesSummary` of its samples, and
    every divergence record (kind, position, excerpt) that split a merged sample, for logs and
    dashboards."""

    episodes: int = 0
    calls: int = 0
    samples: int = 0
    samples_per_episode: float = 0.0
    tokens: int = 0
    trained_tokens: int = 0
    start_reasons: dict[str, int] = field(default_factory=dict)
    end_reasons: dict[str, int] = field(default_factory=dict)
    divergences_by_kind: dict[str, int] = field(default_factory=dict)
    positions_by_kind: dict[str, list[int]] = field(default_factory=dict)
    divergences: list[dict[str, Any]] = field(default_factory=list)
    """Each divergence as `Divergence.to_dict()`, excerpt included."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready fields (copies: the report stays the caller's to change)."""
        return {
            "episodes": self.episodes,
            "calls": self.calls,
            "samples": self.samples,
            "samples_per_episode": self.samples_per_episode,
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "start_reasons": dict(self.start_reasons),
            "end_reasons": dict(self.end_reasons),
            "divergences_by_kind": dict(self.divergences_by_kind),
            "positions_by_kind": {k: list(v) for k, v in self.positions_by_kind.items()},
            "divergences": [dict(d) for d in self.divergences],
        }

    def format(self) -> str:
        """A few human-readable lines: totals, divergences by kind, one line per divergence."""
        lines = [
            f"{self.episodes} episode(s), {self.calls} call(s) -> {self.samples} sample(s) "
            f"({self.samples_per_episode:.2f} per episode), {self.tokens} tokens, "
            f"{self.trained_tokens} trained"
        ]
        if self.divergences_by_kind:
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.divergences_by_kind.items()))
            lines.append(f"divergences: {kinds}")
        for d in self.divergences:
            agent = "" if d["agent"] is None else f" agent={d['agent']}"
            lines.append(
                f"  {d['kind']}{agent} call={d['call_id']} after {d['prev_call_id']}: {d['excerpt']}"
            )
        return "\n".join(lines)


def assembly_report(
    samples: Iterable[Sample], divergences: Iterable[Divergence] = ()
) -> AssemblyReport:
    """Calls, samples, samples per episode, tokens, reasons (counted as `SamplesSummary` counts
    them: with `assembly="both"`, each call once) and divergences by kind with positions."""
    summary = summarize(samples)
    divergences = list(divergences)
    episodes = set(summary.episode_ids) | {d.episode_id for d in divergences}
    by_kind: Counter[str] = Counter()
    positions: dict[str, list[int]] = {}
    for d in divergences:
        by_kind[d.kind.value] += 1
        positions.setdefault(d.kind.value, []).append(d.rewrite_point)
    return AssemblyReport(
        episodes=len(episodes),
        calls=summary.calls,
        samples=summary.samples,
        samples_per_episode=summary.samples / len(episodes) if episodes else 0.0,
        tokens=summary.tokens,
        trained_tokens=summary.trained_tokens,
        start_reasons=dict(summary.start_reasons),
        end_reasons=dict(summary.end_reasons),
        divergences_by_kind=dict(by_kind),
        positions_by_kind=positions,
        divergences=[d.to_dict() for d in divergences],
    )


def _distribution(values: array[int]) -> dict[str, Any]:
    if not values:
        return {"min": 0, "mean": 0.0, "p50": 0, "p90": 0, "max": 0}
    data = np.frombuffer(values, dtype=np.int64)
    return {
        "min": int(data.min()),
        "mean": float(data.mean()),
        "p50": float(np.median(data)),
        "p90": float(np.quantile(data, 0.9)),
        "max": int(data.max()),
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
