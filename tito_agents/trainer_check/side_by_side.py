"""Side by side: the tito samples through every converter layout, and the same episodes through a
text pipeline, scored by the same trainer-side model in one run.

`compare(samples, calls, model_dir)` loads the served weights in each requested dtype, scores every
layout (`layouts.py`) and the text rebuild (`text_pipeline.py`), and returns a `Comparison`: per
dtype and layout the log-ratio figures on free-running tokens and, apart, on tokens sampled under a
constraint (forced tool choice, structured outputs), whose rollout logprobs are those of the
grammar-masked distribution and are not expected to match the free policy; plus how many trained
tokens differ from the ids the engine sampled. `Comparison.to_dict()` is what
`tito-agents compare` plots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.calls import Call
from tito_agents.convert import needs_behaviour_logprobs
from tito_agents.samples import Sample
from tito_agents.trainer_check.behaviour_ratios import BehaviourFigures, behaviour_figures
from tito_agents.trainer_check.layouts import LAYOUTS, TokenScores, score_layout
from tito_agents.trainer_check.model import load_policy, load_tokenizer, next_token_logprobs
from tito_agents.trainer_check.ratio_stats import CLIP, RatioStats
from tito_agents.trainer_check.text_pipeline import TextRow, rebuild

HISTOGRAM_LIMIT = 20_000
"""Log ratios kept per pipeline for the plot (the first ones, in sample order)."""


def call_constraint(call: Call) -> str | None:
    """How `call` was constrained: `Call.constrained` where the capture records it, else read from
    the request's sampling settings (a forced tool choice, `response_format`, structured or guided
    outputs)."""
    if hasattr(call, "constrained"):
        return getattr(call, "constrained", None)
    sampling = call.sampling
    choice = sampling.get("tool_choice")
    if call.tools and choice == "required":
        return "tool_choice=required"
    if call.tools and isinstance(choice, dict):
        return "tool_choice=named"
    fmt = sampling.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        return f"response_format={fmt['type']}"
    for key in ("structured_outputs", "guided_json", "guided_regex", "guided_choice"):
        if sampling.get(key) is not None:
            return key
    return None


def constrained_calls(samples: Iterable[Sample], calls: Mapping[str, Call]) -> frozenset[str]:
    """Ids of the calls sampled under a constraint: the span's own flag when the samples carry it,
    else what the kept `Call` says."""
    out: set[str] = set()
    for sample in samples:
        for span in sample.spans:
            if hasattr(span, "constrained"):
                kind = getattr(span, "constrained", None)
            else:
                call = calls.get(span.call_id)
                kind = None if call is None else call_constraint(call)
            if kind:
                out.add(span.call_id)
    return frozenset(out)


def constrained_mask(sample: Sample, constrained: frozenset[str]) -> npt.NDArray[np.bool_]:
    """Per token of `sample`: sampled under a constraint (`Sample.constrained_mask()` when the
    schema has it, else from the spans of `constrained` calls)."""
    method = getattr(sample, "constrained_mask", None)
    if callable(method):
        return np.asarray(method(), dtype=bool)
    mask = np.zeros(sample.num_tokens, dtype=bool)
    for span in sample.spans:
        if span.call_id in constrained:
            mask[span.start : span.end] = True
    return mask


def masked_rollout(sample: Sample, constrained: frozenset[str]) -> npt.NDArray[np.bool_]:
    """Per token of `sample`: its rollout logprob is the grammar-masked distribution's and nothing
    re-scored it (`CallSpan.logprob_source == "masked"`; for samples without that field, a
    constrained span of a sample without `policy_logprobs`). No importance ratio can use those."""
    mask = np.zeros(sample.num_tokens, dtype=bool)
    has_policy = getattr(sample, "policy_logprobs", None) is not None
    for span in sample.spans:
        source = getattr(span, "logprob_source", None)
        if source == "masked" or (
            source is None and span.call_id in constrained and not has_policy
        ):
            mask[span.start : span.end] = True
    return mask


def engine_ids(sample: Sample, calls: Mapping[str, Call]) -> npt.NDArray[np.int64]:
    """The ids the engine sampled for this sample's calls, in span order (from the kept calls;
    the sample's own trained ids where a call was not kept)."""
    parts = []
    for span in sample.spans:
        call = calls.get(span.call_id)
        ids = sample.token_ids[span.start : span.end] if call is None else call.sampled_ids
        parts.append(np.asarray(ids, dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class PipelineFigures:
    """One pipeline (a tito layout, or the text rebuild) scored in one dtype."""

    free: RatioStats
    """Tokens sampled freely: the ratio a PPO / GRPO loss sees."""
    constrained: RatioStats
    """Tokens sampled under a constraint, against their (masked) rollout logprobs."""
    trained_tokens: int
    differing: int
    """Trained tokens that are not the id the engine sampled at that place."""
    constrained_policy: RatioStats | None = None
    """Constrained tokens against re-scored policy logprobs, when the samples carry them."""
    calls_drifted: int | None = None
    """Text pipeline only: calls whose turn re-tokenizes to other ids."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "free": self.free.to_dict(),
            "constrained": self.constrained.to_dict(),
            "constrained_policy": None
            if self.constrained_policy is None
            else self.constrained_policy.to_dict(),
            "trained_tokens": self.trained_tokens,
            "differing": self.differing,
            "calls_drifted": self.calls_drifted,
        }


@dataclass(slots=True)
class Comparison:
    """Every figure of one run, by dtype and pipeline, plus free-token log ratios for the plot."""

    model: str
    samples: int
    calls: int
    tito: dict[str, dict[str, PipelineFigures]] = field(default_factory=dict)
    """`tito[dtype][layout]`."""
    text: dict[str, PipelineFigures] = field(default_factory=dict)
    """`text[dtype]`."""
    log_ratios: dict[str, list[float]] = field(default_factory=dict)
    """Free-token log ratios per pipeline ("tito", "text") in the first dtype, for the plot."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Whatever else the run reports (the RL step, the second round)."""
    behaviour: dict[str, BehaviourFigures] = field(default_factory=dict)
    """`behaviour[dtype]`: naive and behaviour-corrected ratios
    (`behaviour_ratios.behaviour_figures`), in the first dtype, when some span was sampled tempered
    or truncated."""

    def headline(self) -> tuple[str, str]:
        """The two lines that matter: tito and the text pipeline, first dtype, free tokens; tito's
        worst layout."""
        dtype = next(iter(self.tito))
        worst = max(self.tito[dtype].items(), key=lambda kv: kv[1].free.mean_abs)
        tito = (
            f"tito ({dtype}, worst of {len(self.tito[dtype])} layouts: {worst[0]}): "
            f"{worst[1].free.line()}; {worst[1].differing} trained tokens differ from the "
            "sampled ids"
        )
        text_figures = self.text.get(dtype)
        if text_figures is None:
            return tito, "text pipeline: not run"
        text = (
            f"text pipeline ({dtype}): {text_figures.free.line()}; {text_figures.differing} of "
            f"{text_figures.trained_tokens} trained tokens differ from the sampled ids"
        )
        return tito, text

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "samples": self.samples,
            "calls": self.calls,
            "clip": CLIP,
            "tito": {d: {k: v.to_dict() for k, v in by.items()} for d, by in self.tito.items()},
            "text": {d: v.to_dict() for d, v in self.text.items()},
            "log_ratios": self.log_ratios,
            "extra": self.extra,
            "behaviour": {d: v.to_dict() for d, v in self.behaviour.items()},
        }


def _layout_figures(
    scores: Sequence[TokenScores],
    samples: Sequence[Sample],
    calls: Mapping[str, Call],
    constrained: frozenset[str],
) -> tuple[PipelineFigures, npt.NDArray[np.float64]]:
    """Free tokens against the rollout logprobs the layout carries; constrained tokens against the
    engine's (masked) logprobs and, where the samples were re-scored, the policy's."""
    free: list[npt.NDArray[np.float64]] = []
    forced: list[npt.NDArray[np.float64]] = []
    forced_policy: list[npt.NDArray[np.float64]] = []
    differing = trained = 0
    for sample, score in zip(samples, scores, strict=True):
        positions = np.flatnonzero(sample.loss_mask)
        if positions.shape[0] != score.trainer.shape[0]:
            raise AssertionError(f"sample {sample.sample_id}: layout lost trained tokens")
        flags = constrained_mask(sample, constrained)[positions]
        free.append((score.trainer - score.rollout)[~flags])
        if flags.any():
            assert sample.logprobs is not None
            engine = sample.logprobs[positions].astype(np.float64)
            forced.append((score.trainer - engine)[flags])
            policy = getattr(sample, "policy_logprobs", None)
            if policy is not None:
                forced_policy.append((score.trainer - policy[positions])[flags])
        expected = engine_ids(sample, calls)
        common = min(expected.shape[0], score.ids.shape[0])
        differing += int(np.count_nonzero(score.ids[:common] != expected[:common]))
        differing += abs(expected.shape[0] - score.ids.shape[0])  # tokens one side lacks
        trained += int(positions.shape[0])
    free_all = np.concatenate(free)
    return (
        PipelineFigures(
            free=RatioStats.of(free_all),
            constrained=RatioStats.of(np.concatenate(forced) if forced else np.zeros(0)),
            constrained_policy=RatioStats.of(np.concatenate(forced_policy))
            if forced_policy
            else None,
            trained_tokens=trained,
            differing=differing,
        ),
        free_all,
    )


def _text_figures(
    model: Any, rows: Sequence[TextRow], pad_id: int
) -> tuple[PipelineFigures, npt.NDArray[np.float64]]:
    """Score the text rows right-padded (the text pipeline's own layout) and compare."""
    width = max(int(r.input_ids.shape[0]) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    attention = np.zeros_like(ids)
    for b, row in enumerate(rows):
        n = int(row.input_ids.shape[0])
        ids[b, :n] = row.input_ids
        attention[b, :n] = 1
    lp = next_token_logprobs(model, ids, attention_mask=attention)
    free: list[npt.NDArray[np.float64]] = []
    forced: list[npt.NDArray[np.float64]] = []
    for b, row in enumerate(rows):
        log_ratio = lp[b, row.trained - 1] - row.rollout
        free.append(log_ratio[~row.constrained])
        forced.append(log_ratio[row.constrained])
    free_all = np.concatenate(free)
    return (
        PipelineFigures(
            free=RatioStats.of(free_all),
            constrained=RatioStats.of(np.concatenate(forced)),
            trained_tokens=sum(int(r.trained.shape[0]) for r in rows),
            differing=sum(int(np.count_nonzero(~r.matches)) for r in rows),
            calls_drifted=sum(r.calls_drifted for r in rows),
        ),
        free_all,
    )


def text_rows(
    samples: Sequence[Sample],
    calls: Mapping[str, Call],
    tokenizer: Any,
    *,
    chat_template: str,
    constrained: frozenset[str],
) -> list[TextRow]:
    """Every sample rebuilt through the text pipeline with `chat_template` (the server's)."""
    from tito_agents.token_codec import TokenCodec

    tokenizer.chat_template = chat_template
    codec = TokenCodec(tokenizer)
    eos = frozenset(
        int(i) for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None
    )
    end_of_turn = str(tokenizer.eos_token)
    return [
        rebuild(
            s, calls, codec, eos_ids=eos, end_of_turn=end_of_turn, constrained_calls=constrained
        )
        for s in samples
    ]


SERVED_TEMPLATE_PATH = Path(__file__).parents[1] / "testing" / "templates" / "chatml_tools.jinja"
"""The chat template `scripts/vllm_server.py` serves SmolLM2 with (a data file shipped beside the
fake vLLM, `tito_agents.testing.smollm2.TOOLS_TEMPLATE_PATH`): read as a file, so the trainer
check never imports the test package."""


def compare(
    samples: Sequence[Sample],
    calls: Mapping[str, Call],
    model_dir: str | Path,
    *,
    dtypes: Sequence[str] = ("fp32",),
    layouts: Sequence[str] = LAYOUTS,
    other_layouts: Sequence[str] | None = None,
    text_dtypes: Sequence[str] | None = None,
    chat_template: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Score `samples` (with the `calls` they came from, by call id) as a trainer would, in every
    dtype and layout, and the text pipeline's rebuild of the same episodes beside them.

    `layouts` are scored in the first dtype, `other_layouts` (default: the same) in the others: a
    bf16 forward pass on CPU costs several fp32 ones, and the layouts agree to 1e-5 in any dtype.
    `text_dtypes` defaults to `dtypes`; pass `()` to skip the text pipeline, which needs the
    calls' messages (`Collector(keep_messages=True)`, the default) and the server's chat template
    (`chat_template`, default the one `scripts/vllm_server.py` serves SmolLM2 with).
    `progress`, when given, is called with a short line before each forward pass.
    """
    say = progress or (lambda _line: None)
    if not samples:
        raise ValueError("compare needs at least one sample")
    tokenizer = load_tokenizer(model_dir)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    constrained = constrained_calls(samples, calls)
    rows: list[TextRow] | None = None
    text_dtypes = tuple(dtypes if text_dtypes is None else text_dtypes)
    if text_dtypes:
        if chat_template is None:
            chat_template = SERVED_TEMPLATE_PATH.read_text(encoding="utf-8")
        rows = text_rows(
            samples, calls, tokenizer, chat_template=chat_template, constrained=constrained
        )
    result = Comparison(
        model=str(model_dir), samples=len(samples), calls=sum(len(s.spans) for s in samples)
    )
    for dtype in dict.fromkeys((*dtypes, *text_dtypes)):
        model = load_policy(model_dir, dtype)
        if dtype in dtypes:
            result.tito[dtype] = {}
            first = dtype == dtypes[0]
            for layout in layouts if first or other_layouts is None else other_layouts:
                say(f"scoring {layout} in {dtype}")
                scores = score_layout(layout, model, samples, pad_id)
                figures, ratios = _layout_figures(scores, samples, calls, constrained)
                result.tito[dtype][layout] = figures
                result.log_ratios.setdefault("tito", ratios[:HISTOGRAM_LIMIT].tolist())
            if first and needs_behaviour_logprobs(samples):
                say(f"scoring behaviour logprobs in {dtype}")
                result.behaviour[dtype] = behaviour_figures(model, samples)
        if rows is not None and dtype in text_dtypes:
            say(f"scoring the text pipeline in {dtype}")
            figures, ratios = _text_figures(model, rows, pad_id)
            result.text[dtype] = figures
            result.log_ratios.setdefault("text", ratios[:HISTOGRAM_LIMIT].tolist())
        del model
    return result
