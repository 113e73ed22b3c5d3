"""How the spans of samples were sampled: counted, described and warned about (the `tito-agents`
commands `stats`, `show` and `drift` print these; a pipeline can log them).

A span is one call's part of a sample. A span is *tempered* when it was sampled at a temperature
other than 1, and *truncated* when top-p, top-k or min-p cut the distribution it was sampled from.
Counts spans by what a trainer has to do about their logprobs (`CallSpan.sampling`,
`logprobs_mode`; `tito_agents.sampling`): plain spans (T=1, no truncation) need nothing; tempered or
truncated spans need behaviour logprobs (`tito_agents.convert.behaviour_logprobs`); and some cannot
be corrected from the sample at all, which is what the warnings say:

* tempered or truncated spans with raw logprobs (`--logprobs-mode raw_logprobs`, vLLM's default):
  their rollout logprobs are those of the untempered, untruncated softmax, not of the distribution
  that sampled, and rebuilding that one needs the whole vocabulary at sampling time;
* the same with an unknown logprobs mode: nobody can tell which of the two the file holds;
* spans whose logits were reshaped before temperature (penalties, logit bias, allowed ids, bad
  words, min_tokens): a trainer must apply those to its logits too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tito_agents.samples import CallSpan
from tito_agents.sampling import RAW_LOGPROBS, SamplingParams


def marks(span: CallSpan) -> str:
    """A short tag for `show`: "T=0.7 top_p=0.8 [raw_logprobs]", "" for a plain span."""
    sampling = span.sampling
    if sampling is None:
        return ""
    parts = []
    if sampling.is_greedy:
        parts.append("greedy")
    elif sampling.temperature != 1.0:
        parts.append(f"T={sampling.temperature:g}")
    if sampling.is_truncated:
        parts += [
            f"{name}={getattr(sampling, name):g}"
            for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0))
            if getattr(sampling, name) != off
        ]
    if sampling.reshapes_logits:
        parts.append("reshaped")
    if not parts:
        return ""
    if not correctable(span):
        parts.append(f"[{span.logprobs_mode or 'logprobs mode unknown'}: not correctable]")
    return " ".join(parts)


def needs_behaviour(sampling: SamplingParams) -> bool:
    """The distribution that sampled is not the model's raw softmax (greedy spans are a point
    mass: their logprobs are not importance-ratio material either)."""
    return sampling.temperature != 1.0 or sampling.is_truncated


def correctable(span: CallSpan) -> bool:
    """A trainer can compute the ratio against what sampled from this sample: the span is plain,
    or its logprobs are the processed ones (what sampled) and nothing reshaped the logits."""
    sampling = span.sampling
    if sampling is None:
        return True  # nothing recorded: counted apart as unknown
    if sampling.reshapes_logits:
        return False
    if not needs_behaviour(sampling):
        return True
    return span.logprobs_mode is not None and span.logprobs_mode != RAW_LOGPROBS


@dataclass(slots=True)
class SamplingCounts:
    """Spans by how they were sampled (see the module docstring)."""

    spans: int = 0
    unknown: int = 0
    """Spans that do not say how they were sampled (`CallSpan.sampling` is None)."""
    tempered: int = 0
    truncated: int = 0
    reshaped: int = 0
    raw_uncorrectable: int = 0
    """Tempered or truncated spans with raw logprobs."""
    mode_unknown: int = 0
    """Tempered or truncated spans whose logprobs mode is unknown."""
    modes: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)

    def add(self, spans: Iterable[CallSpan]) -> None:
        for span in spans:
            self.spans += 1
            sampling = span.sampling
            if sampling is None:
                self.unknown += 1
                continue
            self.modes[span.logprobs_mode or "unknown"] += 1
            self.sources[span.sampling_source or "unknown"] += 1
            self.tempered += not sampling.is_greedy and sampling.temperature != 1.0
            self.truncated += sampling.is_truncated
            self.reshaped += sampling.reshapes_logits
            if needs_behaviour(sampling):
                if span.logprobs_mode == RAW_LOGPROBS:
                    self.raw_uncorrectable += 1
                elif span.logprobs_mode is None:
                    self.mode_unknown += 1

    def absorb(self, other: SamplingCounts) -> None:
        for name in (
            "spans",
            "unknown",
            "tempered",
            "truncated",
            "reshaped",
            "raw_uncorrectable",
            "mode_unknown",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.modes.update(other.modes)
        self.sources.update(other.sources)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spans": self.spans,
            "unknown": self.unknown,
            "tempered": self.tempered,
            "truncated": self.truncated,
            "reshaped": self.reshaped,
            "raw_uncorrectable": self.raw_uncorrectable,
            "mode_unknown": self.mode_unknown,
            "logprobs_modes": dict(self.modes.most_common()),
            "sources": dict(self.sources.most_common()),
        }


_MODE_MEANINGS = {
    RAW_LOGPROBS: "the model's own softmax, before temperature and truncation",
    "processed_logprobs": "of the distribution that sampled",
}


def describe(counts: dict[str, Any]) -> list[str]:
    """How the spans were sampled, in words (one line each): how many were truncated and
    tempered, and what their logprobs are (or that they do not say)."""
    spans, unknown = counts["spans"], counts["unknown"]
    known = spans - unknown
    lines = [
        "sampling (a span is one call's part of a sample):",
        f"  {counts['truncated']:,} of {known:,} spans truncated (top-p, top-k or min-p cut the "
        "distribution they were sampled from)",
        f"  {counts['tempered']:,} of {known:,} spans tempered (sampled at a temperature other "
        "than 1)",
    ]
    if counts["reshaped"]:
        lines.append(
            f"  {counts['reshaped']:,} of {known:,} spans reshaped (penalties, logit bias, ...)"
        )
    modes = dict(counts["logprobs_modes"])
    mode_unknown = modes.pop("unknown", 0)
    for mode, n in modes.items():
        meaning = _MODE_MEANINGS.get(mode)
        lines.append(f"  {n:,} spans hold {mode}" + (f" ({meaning})" if meaning else ""))
    if mode_unknown:
        lines.append(
            f"  {mode_unknown:,} spans do not say whether their logprobs are raw or processed "
            "(the server's --logprobs-mode was not recorded)"
        )
    if unknown:
        lines.append(
            f"  {unknown:,} spans do not say how they were sampled (not recorded in this file)"
        )
    return lines


def warnings(counts: dict[str, Any]) -> list[str]:
    """One line per kind of span whose logprobs a trainer cannot correct from the sample."""
    out = []
    if counts["raw_uncorrectable"]:
        out.append(
            f"warning: {counts['raw_uncorrectable']:,} tempered or truncated spans hold raw "
            "logprobs (server --logprobs-mode raw_logprobs): they are not the logprobs of the "
            "distribution that sampled and the sample cannot correct them; serve with "
            "--logprobs-mode processed_logprobs, or recompute the old logprobs with "
            "behaviour_logprobs from the sampling weights"
        )
    if counts["mode_unknown"]:
        out.append(
            f"warning: {counts['mode_unknown']:,} tempered or truncated spans do not say the "
            "server's logprobs mode (raw or processed): declare it "
            "(tito_agents.sampling.declare_sampling) before computing ratios"
        )
    if counts["reshaped"]:
        out.append(
            f"warning: {counts['reshaped']:,} spans were sampled with penalties, logit bias, "
            "allowed ids, bad words or min_tokens: apply them to the trainer's logits first"
        )
    return out


def counting(samples: Iterable[Any], counts: SamplingCounts) -> Iterator[Any]:
    """Yield `samples` unchanged, counting each call's span once per episode (a file written with
    `assembly="both"` holds every call in two samples; episodes are contiguous in every sink)."""
    episode: str | None = None
    seen: set[str] = set()
    for sample in samples:
        if sample.episode_id != episode:
            episode, seen = sample.episode_id, set()
        fresh = [span for span in sample.spans if span.call_id not in seen]
        seen.update(span.call_id for span in fresh)
        counts.add(fresh)
        yield sample
