"""The trainer's ratio under temperature and truncation: naive (full softmax) vs behaviour logprobs.

A trainer that scores its tokens with `log_softmax(logits)` divides by the right old logprob only
when the engine sampled from that softmax (T=1, no top-k/top-p/min-p) or returned raw logprobs. Under
`--logprobs-mode processed_logprobs` the rollout logprob is the one of the tempered, truncated,
renormalised distribution that sampled (the behaviour policy); the trainer then has to rebuild it
from its own logits (`tito_agents.convert.behaviour_logprobs`, with each span's `CallSpan.sampling`).
Under `raw_logprobs` (vLLM's default) the rollout logprob is the untempered, untruncated one: the
naive ratio *looks* exact while neither side is the distribution that sampled, and the sample alone
cannot correct it (the normaliser over the kept set needs the whole vocabulary).

`behaviour_figures` scores each sample once (one forward pass, no padding) and reports both ratios
on every freely sampled trained token: `naive` (trainer full softmax against the rollout logprob)
and `corrected` (trainer behaviour logprob against the rollout logprob), plus how many sampled tokens
fell outside the support the trainer computed (boundary cases only an engine mask settles; left out
of `corrected`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.convert.behaviour import TokenSampling, behaviour_logprobs
from tito_agents.samples import Sample
from tito_agents.trainer_check.model import logits_of
from tito_agents.trainer_check.ratio_stats import RatioStats


@dataclass(slots=True)
class BehaviourFigures:
    """Naive and behaviour-corrected ratios of one set of samples, in one dtype."""

    naive: RatioStats
    """Trainer `log_softmax(logits)` against the rollout logprobs."""
    corrected: RatioStats
    """Trainer behaviour logprobs (temperature, min-p, top-k, top-p as the span says) against the
    rollout logprobs, on the tokens inside the trainer's support."""
    outside: int
    """Sampled tokens outside the support the trainer computed from its own logits."""
    spans: int
    truncated_spans: int
    logprobs_modes: dict[str, int] = field(default_factory=dict)
    """Spans by `CallSpan.logprobs_mode` ("unknown" when the sample does not say)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "naive": self.naive.to_dict(),
            "corrected": self.corrected.to_dict(),
            "outside": self.outside,
            "spans": self.spans,
            "truncated_spans": self.truncated_spans,
            "logprobs_modes": dict(self.logprobs_modes),
        }

    def lines(self) -> list[str]:
        modes = ", ".join(f"{k} {v}" for k, v in sorted(self.logprobs_modes.items()))
        return [
            f"naive (full softmax):        {self.naive.line()}",
            f"corrected (behaviour):       {self.corrected.line()}",
            f"{self.truncated_spans} of {self.spans} spans truncated; logprobs mode: {modes}; "
            f"{self.outside} sampled tokens outside the trainer's support",
        ]


def _free_positions(sample: Sample) -> npt.NDArray[np.intp]:
    """Trained positions of spans sampled freely (constrained spans' rollout logprobs are those
    of a grammar-masked distribution, which neither ratio can rebuild)."""
    keep = sample.loss_mask.astype(bool).copy()
    for span in sample.spans:
        if span.constrained is not None:
            keep[span.start : span.end] = False
    keep[0] = False  # position 0 has no logits before it
    return np.flatnonzero(keep)


def behaviour_figures(model: Any, samples: Sequence[Sample]) -> BehaviourFigures:
    """Score each sample with `model` (a `load_policy` model) and compare both ratios."""
    naive: list[npt.NDArray[np.float64]] = []
    corrected: list[npt.NDArray[np.float64]] = []
    outside = 0
    modes: Counter[str] = Counter()
    spans = truncated = 0
    for sample in samples:
        spans += len(sample.spans)
        truncated += sum(span.truncated for span in sample.spans)
        modes.update(span.logprobs_mode or "unknown" for span in sample.spans)
        positions = _free_positions(sample)
        if sample.logprobs is None or positions.size == 0:
            continue
        logits = logits_of(model, sample.token_ids[None, :].astype(np.int64))[0]
        rows = logits[positions - 1].double()
        tokens = sample.token_ids[positions].astype(np.int64)
        rollout = sample.logprobs[positions].astype(np.float64)
        full = (rows - rows.logsumexp(dim=-1, keepdim=True)).numpy()
        naive.append(full[np.arange(tokens.size), tokens] - rollout)
        sampling = TokenSampling.of_sample(sample).take(positions)
        out = behaviour_logprobs(rows.float().numpy(), tokens, sampling)
        inside = ~out.outside
        outside += out.n_outside
        corrected.append(out.logprobs[inside].astype(np.float64) - rollout[inside])
    return BehaviourFigures(
        naive=RatioStats.of(np.concatenate(naive) if naive else np.zeros(0)),
        corrected=RatioStats.of(np.concatenate(corrected) if corrected else np.zeros(0)),
        outside=outside,
        spans=spans,
        truncated_spans=truncated,
        logprobs_modes=dict(modes),
    )
