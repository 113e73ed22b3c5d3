"""`tito-agents show`: one sample, token by token, in the terminal or as a self-contained HTML page.

Context tokens, trained (sampled) tokens and tool/environment tokens have their own colours; token
boundaries show as alternating shades (or `|` without colour); rewrite points and the end reason are
marked inline and listed; rewards and per-call spans come first. The file is streamed until the
sample is found, keeping only the samples of its episode (to find where it and its siblings diverge).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

import numpy as np
import orjson

from tito_agents.assembly import sampling_report
from tito_agents.cli._errors import EXIT_OK, CliInputError
from tito_agents.cli._files import write_output
from tito_agents.cli._html import Run, render_html
from tito_agents.cli._input_checks import check_vocabulary
from tito_agents.cli._layout import CLASS_NAMES, CONTEXT, ENV, TRAINED, TokenLayout, build_layout
from tito_agents.cli._samples_file import open_samples_file
from tito_agents.cli._seek import iter_entries
from tito_agents.cli._term import Painter, color_enabled, table
from tito_agents.cli._tokenizers import decode_runs, decode_tokens, load_tokenizer
from tito_agents.samples import Sample
from tito_agents.sinks.reading import JSONL, SampleSource

__all__ = ["add_parser", "find_sample", "format_sample", "locate", "run", "token_texts"]

# 256-colour backgrounds, two shades per class so neighbouring tokens are told apart.
_SHADES = {
    CONTEXT: ("48;5;236", "48;5;238"),
    ENV: ("48;5;94", "48;5;130"),
    TRAINED: ("48;5;22", "48;5;28"),
}
_FOREGROUND = {CONTEXT: "38;5;250", ENV: "38;5;230", TRAINED: "38;5;194"}
_VISIBLE = {"\n": "↵\n", "\t": "→", "\r": "␍"}


class _Identified(Protocol):
    @property
    def sample_id(self) -> str: ...

    @property
    def episode_id(self) -> str: ...


T = TypeVar("T", bound=_Identified)


def find_sample(
    samples: Iterable[T], *, sample_id: str | None = None, index: int = 0
) -> tuple[T, list[T], int]:
    """The wanted sample, the samples of its episode (contiguous in the file, itself included, in
    file order) and how many samples were read.

    `sample_id` may be a unique prefix. An exact id wins and ends the search at its episode's end; a
    prefix is only accepted once the whole file was read and no other sample shares it (an
    ambiguous prefix is refused, naming the samples it matches)."""
    run: list[T] = []  # the current episode's samples so far (the file groups episodes)
    target: T | None = None
    target_run: list[T] = []
    exact = False
    matches: list[str] = []
    read = 0
    for sample in samples:
        read += 1
        if run and sample.episode_id != run[-1].episode_id:
            if exact:
                break
            run = []
        run.append(sample)
        if exact:
            continue  # the target's later siblings
        if sample_id is None:
            if read - 1 == index:
                target, target_run, exact = sample, run, True
        elif sample.sample_id == sample_id:
            target, target_run, exact = sample, run, True
        elif sample.sample_id.startswith(sample_id):
            matches.append(sample.sample_id)
            if target is None:
                target, target_run = sample, run
    if target is None:
        wanted = f"sample id {sample_id!r}" if sample_id else f"sample #{index}"
        raise CliInputError(None, f"no {wanted} among {read:,} samples")
    if not exact and len(matches) > 1:
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CliInputError(
            None,
            f"sample id prefix {sample_id!r} is ambiguous: {len(matches):,} samples match "
            f"({shown}); give more characters",
        )
    return target, target_run, read


def token_texts(sample: Sample, tokenizer: Any | None) -> list[str]:
    """Each token's text (decoded with `tokenizer`), or its id when there is no tokenizer."""
    if tokenizer is None:
        return [str(int(i)) for i in sample.token_ids]
    return decode_tokens(tokenizer, sample.token_ids)


def html_runs(view: TokenLayout, tokenizer: Any | None) -> list[Run]:
    """What the page draws: one id per token without a tokenizer; with one, each token's text,
    with a character split across tokens decoded whole on its run (never across a class or call)."""
    sample = view.sample
    if tokenizer is None:
        return [(i, i + 1, str(int(t))) for i, t in enumerate(sample.token_ids)]
    keys = (view.classes.astype(np.int64) * (1 << 32) + view.call_of.astype(np.int64)).tolist()
    return decode_runs(tokenizer, sample.token_ids, keys)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show",
        help="one sample token by token: context, trained and tool tokens, spans, rewrite points",
        description="Show one sample in the terminal, or write it as a self-contained HTML page.",
    )
    parser.add_argument(
        "samples_file", help="a samples file written by any sink, or a folder of them"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sample", metavar="ID", help="sample id (or a unique prefix of it)")
    which.add_argument(
        "--index",
        type=int,
        default=0,
        metavar="N",
        help="the N-th sample, from 0; a negative N counts from the end (-1: the last)",
    )
    parser.add_argument(
        "--tokenizer", metavar="DIR_OR_GGUF", help="decode tokens to text (else ids are shown)"
    )
    parser.add_argument("--html", metavar="OUT", help="write a self-contained HTML page to OUT")
    parser.add_argument(
        "--json", action="store_true", help="print counts, spans and markers as JSON"
    )
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--allow-truncated", action="store_true", help="skip a torn last line")
    parser.set_defaults(handler=run)


def locate(
    samples: SampleSource, *, sample_id: str | None = None, index: int = 0
) -> tuple[Sample, list[Sample]]:
    """The wanted sample and its episode's samples, as `find_sample` finds them. JSON Lines files
    are searched line by line without building the other samples (`_seek`): `--index 47000` on a
    1 GB file reads it at disk speed. Other formats are read sample by sample. The episode list
    holds the samples the view needs: the target and its episode's merged samples. A negative
    `index` counts from the end, as in Python (the file is read once more to count)."""
    if sample_id is None and index < 0:
        index = _from_end(samples, index)
    if samples.format != JSONL:
        target, episode, _ = find_sample(samples, sample_id=sample_id, index=index)
        return target, episode
    files = list(samples.parts or (samples.path,))
    entries = iter_entries(files, keep_id=sample_id, keep_index=None if sample_id else index)
    found, run, _ = find_sample(entries, sample_id=sample_id, index=index)
    target = found.sample()
    return target, [e.sample() for e in run if e is found or e.merged]


def _from_end(samples: SampleSource, index: int) -> int:
    """The index from the start of the sample `index` (< 0) counts from the end."""
    if samples.format == JSONL:
        entries = iter_entries(
            list(samples.parts or (samples.path,)), keep_id=None, keep_index=None
        )
        total = sum(1 for _ in entries)
    else:
        total = sum(1 for _ in samples)
    if total + index < 0:
        raise CliInputError(None, f"no sample #{index} among {total:,} samples")
    return total + index


def run(args: argparse.Namespace) -> int:
    samples = open_samples_file(args.samples_file, allow_truncated=args.allow_truncated)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    try:
        target, episode = locate(samples, sample_id=args.sample, index=args.index)
    except CliInputError as exc:
        if exc.path is not None or exc.problem.startswith(str(samples.path)):
            raise
        raise CliInputError(samples.path, exc.problem) from exc  # e.g. "no sample #0 among 0"
    html = None
    if tokenizer is not None:
        check_vocabulary([target], len(tokenizer))
    view = build_layout(target, episode)
    texts = token_texts(target, tokenizer)
    if args.html:
        runs = html_runs(view, tokenizer)
        page = render_html(view, runs, source=str(samples.path), ids_only=tokenizer is None)
        html = str(write_output(args.html, page))
    if args.json:
        data = {**view.to_dict(), **_header_data(target), "html": html}
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif args.html:
        counts = view.counts()
        sys.stdout.write(
            f"wrote {html}: sample {target.sample_id}, {counts['tokens']:,} tokens "
            f"({counts['trained']:,} trained, {counts['constrained']:,} of them constrained, "
            f"{counts['env']:,} tool/env, "
            f"{counts['context']:,} context), {counts['rewrite_points']} rewrite point(s)\n"
        )
    else:
        paint = Painter(color_enabled(args.color))
        sys.stdout.write(format_sample(view, texts, paint) + "\n")
    return EXIT_OK


def _header_data(sample: Sample) -> dict[str, Any]:
    return {
        "episode_id": sample.episode_id,
        "agent": sample.agent,
        "model": sample.model,
        "task_id": sample.task_id,
        "reward": sample.reward,
        "start_reason": sample.start_reason,
        "end_reason": sample.end_reason,
        "spans": [s.to_dict() for s in sample.spans],
    }


def format_sample(view: TokenLayout, texts: list[str], paint: Painter) -> str:
    """Header, spans table, legend, then the tokens with markers inline, then the markers listed."""
    sample = view.sample
    counts = view.counts()
    lp = "yes" if sample.logprobs is not None else "no"
    lines = [
        paint(f"sample {sample.sample_id}", "bold")
        + f"  episode {sample.episode_id}  agent {sample.agent or '-'}  model {sample.model or '-'}",
        f"reward {_reward(sample.reward)}   start {sample.start_reason}   end {sample.end_reason}"
        f"   logprobs {lp}",
        f"tokens {counts['tokens']:,}: context {counts['context']:,}, tool/env {counts['env']:,}, "
        f"trained {counts['trained']:,}   calls {counts['calls']}   rewrite points "
        f"{counts['rewrite_points']}",
        *_constrained_lines(view),
        *_sampling_lines(sample),
        "",
        table(
            (
                "#",
                "call",
                "context",
                "sampled",
                "finish",
                "reward",
                "policy",
                "constrained",
                "sampling",
            ),
            [
                (
                    k,
                    s.call_id,
                    f"{s.context_start}:{s.start}",
                    f"{s.start}:{s.end}",
                    s.finish_reason or "-",
                    _reward(s.reward),
                    s.policy_version or "-",
                    _constraint(s),
                    sampling_report.marks(s) or "-",
                )
                for k, s in enumerate(sample.spans)
            ],
        ),
        "",
        "legend: "
        + "  ".join(_legend(paint))
        + "   ⟂ rewrite point / end   ≋ sampled under a constraint",
        "",
        _tokens(view, texts, paint),
        "",
    ]
    for marker in view.markers:
        lines.append(
            paint(
                f"⟂ @{marker.position}: {marker.label}",
                "magenta" if marker.kind != "end" else "grey",
            )
        )
    return "\n".join(lines)


def _sampling_lines(sample: Sample) -> list[str]:
    """A line when some span was sampled from a truncated distribution (and the warnings for
    spans whose logprobs a trainer cannot correct from the sample)."""
    counts = sampling_report.SamplingCounts()
    counts.add(sample.spans)
    data = counts.to_dict()
    if not (data["truncated"] or data["tempered"] or data["reshaped"]):
        return []
    line = (
        f"sampling: {data['truncated']} of {len(sample.spans)} span(s) truncated (top-k/top-p/"
        f"min-p), {data['tempered']} tempered: a trainer needs behaviour logprobs "
        "(docs/converters.md)"
    )
    return [line, *sampling_report.warnings(data)]


def _constraint(span: Any) -> str:
    """A span's constraint and what its logprobs are, e.g. `tool_choice=required (masked)`."""
    kind = getattr(span, "constrained", None)
    if not kind:
        return "-"
    source = getattr(span, "logprob_source", None)
    error = getattr(span, "rescore_error", None)
    return f"{kind} ({source or 'no logprobs'}{'; ' + error if error else ''})"


def _constrained_lines(view: TokenLayout) -> list[str]:
    """A warning line when some trained tokens were sampled under a constraint."""
    n = view.counts()["constrained"]
    if not n:
        return []
    masked = sum(
        1
        for s in view.sample.spans
        if getattr(s, "constrained", None) and getattr(s, "logprob_source", None) == "masked"
    )
    line = f"constrained: {n:,} trained tokens sampled under a constraint (tagged ≋)"
    if masked:
        line += f"; {masked} span(s) hold only post-mask logprobs, not the policy's"
    return [line]


def _legend(paint: Painter) -> list[str]:
    names = {CONTEXT: "context", ENV: "tool/env", TRAINED: "trained"}
    return [_paint_token(paint, f" {names[c]} ", c, 0) for c in (CONTEXT, ENV, TRAINED)]


def _tokens(view: TokenLayout, texts: list[str], paint: Painter) -> str:
    markers_at: dict[int, list[str]] = {}
    for marker in view.markers:
        markers_at.setdefault(marker.position, []).append(marker.reason)
    constrained = view.constrained_of()
    out: list[str] = []
    previous: tuple[int, str | None] = (-1, None)
    for i, text in enumerate(texts):
        for reason in markers_at.get(i, ()):
            out.append(paint(f"⟂{reason}⟂", "1", "38;5;201") if paint.enabled else f"⟂{reason}⟂")
        cls = int(view.classes[i])
        if constrained[i] and (cls, constrained[i]) != previous:
            out.append(paint(f"≋{constrained[i]}≋", "1", "38;5;205"))
        if paint.enabled:
            out.append(_paint_token(paint, _visible(text), cls, i))
        else:
            if (cls, constrained[i]) != previous:
                call = int(view.call_of[i])
                where = f" call {call}" if call >= 0 else ""
                out.append(f"«{CLASS_NAMES[cls]}{where}»")
            elif out and not out[-1].endswith(("\n", "⟂")):
                out.append("|")  # a token boundary; none at a line start
            out.append(_visible(text))
        previous = (cls, constrained[i])
    for reason in markers_at.get(len(texts), ()):
        out.append(paint(f"⟂{reason}⟂", "1", "38;5;201"))
    return "".join(out)


def _paint_token(paint: Painter, text: str, cls: int, i: int) -> str:
    """A token in its class colours; newlines stay outside the codes so shades never bleed."""
    if not paint.enabled:
        return text
    return "\n".join(
        paint(part, _FOREGROUND[cls], _SHADES[cls][i % 2]) if part else ""
        for part in text.split("\n")
    )


def _visible(text: str) -> str:
    for raw, shown in _VISIBLE.items():
        text = text.replace(raw, shown)
    return text


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
