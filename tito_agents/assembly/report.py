"""Assembly reports: counts over samples and divergences, for logs, dashboards and `tito-agents`.

Kept apart from assembly itself: a report reads finished samples (of any mode, any number of
episodes) and never takes part in making them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tito_agents.assembly.divergence import Divergence
from tito_agents.samples import Sample


@dataclass(slots=True)
class AssemblyReport:
    """Counts over samples and divergences (one episode or many), for logs and dashboards."""

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
    """Calls, samples, samples per episode, tokens, reasons and divergences by kind with positions."""
    samples = list(samples)
    divergences = list(divergences)
    episodes = {s.episode_id for s in samples} | {d.episode_id for d in divergences}
    call_ids = {c for s in samples for c in s.call_ids}
    by_kind: Counter[str] = Counter()
    positions: dict[str, list[int]] = {}
    for d in divergences:
        by_kind[d.kind.value] += 1
        positions.setdefault(d.kind.value, []).append(d.rewrite_point)
    return AssemblyReport(
        episodes=len(episodes),
        calls=len(call_ids),
        samples=len(samples),
        samples_per_episode=len(samples) / len(episodes) if episodes else 0.0,
        tokens=sum(s.num_tokens for s in samples),
        trained_tokens=sum(s.num_trained for s in samples),
        start_reasons=dict(Counter(s.start_reason for s in samples)),
        end_reasons=dict(Counter(s.end_reason for s in samples)),
        divergences_by_kind=dict(by_kind),
        positions_by_kind=positions,
        divergences=[d.to_dict() for d in divergences],
    )
