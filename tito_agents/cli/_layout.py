"""What `show` draws, computed once for the terminal and the HTML page alike.

Every token gets a class: `trained` (loss 1: the engine sampled it), `env` (context a later call
added: tool results, user turns and template glue between two calls of a merged sample) or `context`
(the first call's prompt). Markers sit between tokens: where a sample started by diverging from an
earlier sample of the same agent (its rewrite point: the first position where it differs from that
sample's ids), where later samples diverged from this one, and the sample's end reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.assembly.divergence import EPISODE_START, common_prefix_len
from tito_agents.samples import Sample

__all__ = [
    "CLASS_NAMES",
    "CONTEXT",
    "ENV",
    "REWRITE_KINDS",
    "TRAINED",
    "Marker",
    "TokenLayout",
    "build_layout",
]

CONTEXT, ENV, TRAINED = 0, 1, 2
REWRITE_KINDS = frozenset({"diverged_from", "diverged_here"})
"""Marker kinds that are rewrite points (counted in `counts()["rewrite_points"]`)."""
CLASS_NAMES = ("context", "env", "trained")
PER_CALL = "call"


@dataclass(frozen=True, slots=True)
class Marker:
    """A mark drawn before token `position` (== number of tokens: after the last one)."""

    position: int
    kind: str
    """`diverged_from` (this sample's rewrite point), `diverged_here` (a later sample left this
    one here), `start` (the sample's start reason) or `end` (its end reason)."""
    label: str
    reason: str
    other_sample_id: str | None = None


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """A sample's tokens as `show` draws them: each token's class and call, and the markers
    between tokens (not `tito_agents.samples.SampleView`, which names per-call vs merged)."""

    sample: Sample
    classes: npt.NDArray[np.uint8]
    """Per token: CONTEXT, ENV or TRAINED."""
    call_of: npt.NDArray[np.int32]
    """Per token: index of the span whose context or sampled ids hold it, -1 for none."""
    markers: list[Marker]

    def counts(self) -> dict[str, int]:
        """Tokens per class, calls and markers: the figures both outputs show."""
        by_class = np.bincount(self.classes, minlength=3)
        return {
            "tokens": int(self.classes.shape[0]),
            "context": int(by_class[CONTEXT]),
            "env": int(by_class[ENV]),
            "trained": int(by_class[TRAINED]),
            "constrained": self.constrained_tokens(),
            "calls": len(self.sample.spans),
            "rewrite_points": sum(m.kind in REWRITE_KINDS for m in self.markers),
        }

    def constrained_tokens(self) -> int:
        """Trained tokens of spans sampled under a constraint (`CallSpan.constrained`)."""
        mask = self.sample.loss_mask
        return sum(
            int(np.count_nonzero(mask[s.start : s.end])) for s in self.sample.spans if s.constrained
        )

    def constrained_of(self) -> list[str | None]:
        """Per token: the constraint its call was sampled under (sampled tokens only), else None."""
        kinds: list[str | None] = [None] * self.sample.num_tokens
        for span in self.sample.spans:
            kind = span.constrained
            if kind:
                kinds[span.start : span.end] = [str(kind)] * (span.end - span.start)
        return kinds

    def to_dict(self) -> dict[str, Any]:
        return {
            "sample_id": self.sample.sample_id,
            "counts": self.counts(),
            "markers": [
                {
                    "position": m.position,
                    "kind": m.kind,
                    "reason": m.reason,
                    "label": m.label,
                    "other_sample_id": m.other_sample_id,
                }
                for m in self.markers
            ],
        }


def build_layout(sample: Sample, siblings: Sequence[Sample] = ()) -> TokenLayout:
    """The view of `sample`; `siblings` are the other samples of its episode, in file order."""
    n = sample.num_tokens
    classes = np.zeros(n, dtype=np.uint8)
    call_of = np.full(n, -1, dtype=np.int32)
    for k, span in enumerate(sample.spans):
        call_of[span.context_start : span.end] = k
        if k > 0:
            classes[span.context_start : span.start] = ENV
    classes[sample.loss_mask.astype(bool)] = TRAINED
    return TokenLayout(sample, classes, call_of, _markers(sample, siblings))


def _markers(sample: Sample, siblings: Sequence[Sample]) -> list[Marker]:
    order = _Order(siblings)
    markers: list[Marker] = []
    merged = sample.start_reason != PER_CALL
    family = [
        s
        for s in siblings
        if s.sample_id != sample.sample_id
        and s.agent == sample.agent
        and s.start_reason != PER_CALL
    ]
    if merged and sample.start_reason != EPISODE_START:
        markers.append(_own_rewrite_point(sample, family, order))
    if merged:
        markers.extend(_children(sample, family, order))
    end_label = (
        f"ended: {sample.end_reason}"
        if not merged or sample.end_reason == "end"
        else f"ended: the next call of this agent diverged ({sample.end_reason})"
    )
    markers.append(Marker(sample.num_tokens, "end", end_label, sample.end_reason))
    return sorted(markers, key=lambda m: (m.position, m.kind != "diverged_from"))


def _own_rewrite_point(sample: Sample, family: Sequence[Sample], order: _Order) -> Marker:
    """Where this sample's context stops matching the sample it diverged from (its parent)."""
    kind = sample.start_reason
    parent, point = _best_parent(sample, [s for s in family if order.before(s, sample)])
    if kind == "resample" and sample.spans:
        point = sample.spans[
            0
        ].start  # two samplings of one prompt: they part where sampling starts
    if parent is None:
        start = sample.spans[0].start if sample.spans else 0
        return Marker(
            start, "start", f"started by a divergence ({kind}); parent not in this file", kind
        )
    return Marker(
        point,
        "diverged_from",
        f"rewrite point: differs from sample {parent.sample_id} here ({kind})",
        kind,
        parent.sample_id,
    )


def _children(sample: Sample, family: Sequence[Sample], order: _Order) -> list[Marker]:
    """Rewrite points of later samples whose closest earlier sample is this one."""
    markers = []
    for child in family:
        if child.start_reason == EPISODE_START or not order.before(sample, child):
            continue
        earlier = [s for s in family if s is not child and order.before(s, child)]
        parent, point = _best_parent(child, [*earlier, sample])
        if parent is not sample:
            continue
        if child.start_reason == "resample" and child.spans:
            point = child.spans[0].start
        markers.append(
            Marker(
                min(point, sample.num_tokens),
                "diverged_here",
                f"rewrite point: sample {child.sample_id} diverged here ({child.start_reason})",
                child.start_reason,
                child.sample_id,
            )
        )
    return markers


def _best_parent(sample: Sample, candidates: Sequence[Sample]) -> tuple[Sample | None, int]:
    best: Sample | None = None
    best_point = -1
    for candidate in candidates:
        point = common_prefix_len(sample.token_ids, candidate.token_ids)
        if point >= best_point:  # ties: the latest candidate, like the assembler
            best, best_point = candidate, point
    return best, max(best_point, 0)


class _Order:
    """File order of an episode's samples (samples come in order of their first call)."""

    def __init__(self, samples: Sequence[Sample]) -> None:
        self._index = {id(s): i for i, s in enumerate(samples)}
        self._end = len(samples)

    def before(self, a: Sample, b: Sample) -> bool:
        """Whether `a` comes before `b`; a sample not in the list counts as last."""
        return self._index.get(id(a), self._end) < self._index.get(id(b), self._end + 1)
