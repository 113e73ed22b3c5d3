"""The drift report's figures: tallies per measure, and each episode's calls counted once.

`measure_drift` (in `drift`) measures samples in tokenizer batches; `EpisodeDrift` holds each
sample's measures until its episode is complete, then adds them to the `DriftReport`, leaving out
an agent's per-call samples where the episode also holds its merged ones (`assembly="both"`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXAMPLES", "DriftReport", "EpisodeDrift", "Measure", "SampleDrift"]

EXAMPLES = 5
"""How many drifted calls or prompts the report shows as examples."""


@dataclass(slots=True)
class _Tally:
    scanned: int = 0
    drifted: int = 0
    tokens: int = 0
    tokens_affected: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    tokens_by_kind: Counter[str] = field(default_factory=Counter)

    def add(self, length: int, kind: str | None, affected: int) -> None:
        self.scanned += 1
        self.tokens += length
        if kind is not None:
            self.drifted += 1
            self.tokens_affected += affected
            self.by_kind[kind] += 1
            self.tokens_by_kind[kind] += affected

    def to_dict(self) -> dict[str, Any]:
        return {
            "scanned": self.scanned,
            "drifted": self.drifted,
            "tokens": self.tokens,
            "tokens_affected": self.tokens_affected,
            "by_kind": {
                k: {"count": n, "tokens_affected": self.tokens_by_kind[k]}
                for k, n in sorted(self.by_kind.items())
            },
        }


@dataclass(slots=True)
class DriftReport:
    """Drift counted per call (sampled ids), per sample (whole sequence) and per template re-render.

    A file written with `assembly="both"` holds every call twice, in a per-call and in a merged
    sample; each agent's calls of an episode are counted once, from its merged samples (as
    `stats` counts them). `other_view_samples` counts the per-call samples left out that way.
    """

    calls: _Tally = field(default_factory=_Tally)
    samples_with_drifted_call: int = 0
    sequences: _Tally = field(default_factory=_Tally)
    rerender: _Tally = field(default_factory=_Tally)
    rerender_refused: int = 0
    other_view_samples: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls.to_dict(),
            "samples": {
                "scanned": self.sequences.scanned,
                "with_drifted_call": self.samples_with_drifted_call,
                "other_view_left_out": self.other_view_samples,
            },
            "sequences": self.sequences.to_dict(),
            "template_rerender": {
                "available": self.rerender.scanned > 0 or self.rerender_refused > 0,
                **self.rerender.to_dict(),
                "render_refused": self.rerender_refused,
            },
            "examples": self.examples,
        }


Measure = tuple[int, str | None, int]
"""(tokens scanned, drift kind or None, tokens affected) of one call, sequence or prompt."""


@dataclass(slots=True)
class SampleDrift:
    """What one sample measured, held until its episode is complete (to count each call once)."""

    agent: str | None
    view: str
    calls: list[Measure] = field(default_factory=list)
    sequence: Measure | None = None
    """None when whole sequences are not measured (`--calls-only`)."""
    tokens: int = 0
    rerender: list[Measure] = field(default_factory=list)
    rerender_refused: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


class EpisodeDrift:
    """Adds samples' measures to the report one episode at a time: an agent's per-call samples
    are left out where the same episode also holds its merged samples (`assembly="both"`).
    Episodes are contiguous in a file, as every sink writes them."""

    def __init__(self, report: DriftReport) -> None:
        self.report = report
        self._episode: str | None = None
        self._pending: list[SampleDrift] = []

    def add(self, episode_id: str, measured: SampleDrift) -> None:
        if episode_id != self._episode:
            self.finish()
            self._episode = episode_id
        self._pending.append(measured)

    def pending_examples(self) -> int:
        return sum(len(m.examples) for m in self._pending)

    def finish(self) -> None:
        merged_agents = {m.agent for m in self._pending if m.view == "merged"}
        for measured in self._pending:
            if measured.view != "merged" and measured.agent in merged_agents:
                self.report.other_view_samples += 1
                continue
            self._count(measured)
        self._pending = []

    def _count(self, measured: SampleDrift) -> None:
        report = self.report
        for measure in measured.calls:
            report.calls.add(*measure)
        report.samples_with_drifted_call += any(kind is not None for _, kind, _ in measured.calls)
        if measured.sequence is not None:
            report.sequences.add(*measured.sequence)
        else:
            report.sequences.scanned += 1
            report.sequences.tokens += measured.tokens
        for measure in measured.rerender:
            report.rerender.add(*measure)
        report.rerender_refused += measured.rerender_refused
        room = EXAMPLES - len(report.examples)
        report.examples.extend(measured.examples[: max(room, 0)])
