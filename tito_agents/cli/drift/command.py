"""`tito-agents drift`: how much would have drifted without captured ids.

A pipeline that keeps text and re-tokenizes it trains on other ids than the engine sampled. For each
call of each sample this re-encodes what the engine sampled (decode -> encode, special tokens kept,
no clean-up) and compares ids; for each sample it does the same with the whole sequence, as a
text-only pipeline would. Where messages were captured with a call (in `metadata`, see
`captured_requests`), it also re-renders the chat template and compares the prompt ids. Drift kinds:

* `retokenized`: the text round-trips but the ids differ (the model sampled a non-canonical split);
* `lossy_text`: the decoded text does not even round-trip (e.g. a multi-byte character cut by
  `length`, or ids the tokenizer decodes to replacement characters);
* for template re-rendering: `retokenized`, `template_rerender` (texts equal once whitespace,
  reasoning blocks and special tokens are removed) and `content` (the texts differ).

Tokens affected = tokens from the first differing id to the end of the call (or sample): everything
a trainer would have misaligned. Tokenizer calls are batched, so the fast tokenizer does the work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tito_agents.assembly import sampling_report
from tito_agents.assembly.divergence import common_prefix_len, normalize_template_text
from tito_agents.calls import IdArray
from tito_agents.cli._errors import EXIT_FINDINGS, EXIT_OK, CliInputError
from tito_agents.cli._input_checks import check_chat_template, check_vocabulary
from tito_agents.cli._progress import Progress, progress_enabled
from tito_agents.cli._samples_file import open_samples_file
from tito_agents.cli._templates import check_compiles, load_renderer
from tito_agents.cli._tokenizers import load_tokenizer
from tito_agents.cli.drift.format import format_drift
from tito_agents.cli.drift.report import EXAMPLES, DriftReport, EpisodeDrift, SampleDrift
from tito_agents.samples import Sample
from tito_agents.token_codec import RenderRefused, TemplateRenderer

__all__ = [
    "DriftReport",
    "add_parser",
    "captured_requests",
    "measure_drift",
    "run",
]

_BATCH = 256
_EXCERPT = 6


def captured_requests(sample: Sample) -> dict[str, tuple[list[Any], list[Any] | None]]:
    """The chat messages (and tools) each call of `sample` was sent with, where captured.

    Looked up in `metadata["call_messages"][call_id] = {"messages": [...], "tools": [...]}`, then
    `metadata["messages"]` / `metadata["tools"]` for the sample's last call. Samples carry none today
    (the collector keeps messages on `Call` only); this is where drift finds them once they do.
    """
    meta = sample.metadata
    found: dict[str, tuple[list[Any], list[Any] | None]] = {}
    per_call = meta.get("call_messages")
    if isinstance(per_call, Mapping):
        for call_id, request in per_call.items():
            if isinstance(request, Mapping) and isinstance(request.get("messages"), list):
                tools = request.get("tools")
                found[str(call_id)] = (
                    request["messages"],
                    tools if isinstance(tools, list) else None,
                )
    if isinstance(meta.get("messages"), list) and sample.spans:
        tools = meta.get("tools")
        found.setdefault(
            sample.spans[-1].call_id, (meta["messages"], tools if isinstance(tools, list) else None)
        )
    return found


def measure_drift(
    samples: Iterable[Sample],
    tokenizer: Any,
    *,
    renderer: TemplateRenderer | None = None,
    whole_sequences: bool = True,
    progress: Progress | None = None,
) -> DriftReport:
    """Stream `samples` and count drift; tokenizer work is batched `_BATCH` calls at a time."""
    report = DriftReport()
    episodes = EpisodeDrift(report)
    vocabulary = len(tokenizer)
    for batch in _batches(samples, _BATCH):
        check_vocabulary(batch, vocabulary)
        budget = [EXAMPLES - len(report.examples) - episodes.pending_examples()]
        measured = _measure_batch(batch, tokenizer, renderer, whole_sequences, budget)
        for sample, one in zip(batch, measured, strict=True):
            episodes.add(sample.episode_id, one)
        if progress is not None:
            for sample in batch:
                progress.advance(sample.num_tokens)
    episodes.finish()
    return report


def _batches(samples: Iterable[Sample], size: int) -> Iterator[list[Sample]]:
    batch: list[Sample] = []
    for sample in samples:
        batch.append(sample)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _round_trip(
    tokenizer: Any, id_lists: Sequence[IdArray]
) -> tuple[list[str], list[IdArray], list[str]]:
    """(texts, re-encoded ids, texts of the re-encoded ids) for many id arrays at once."""
    texts: list[str] = tokenizer.batch_decode(
        [ids.tolist() for ids in id_lists],
        skip_special_tokens=False,
        clean_up_tokenization_spaces=False,
    )
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    again: list[str] = tokenizer.batch_decode(
        encoded, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return texts, [np.asarray(e, dtype=np.int32) for e in encoded], again


def _measure_batch(
    batch: list[Sample],
    tokenizer: Any,
    renderer: TemplateRenderer | None,
    whole_sequences: bool,
    budget: list[int],
) -> list[SampleDrift]:
    """Each sample's measures; `budget[0]`: how many more examples to decode (each costs a
    dozen tokenizer calls)."""
    measured = [SampleDrift(s.agent, s.view, tokens=s.num_tokens) for s in batch]
    owners: list[tuple[int, str]] = []
    sampled: list[IdArray] = []
    for k, sample in enumerate(batch):
        for span in sample.spans:
            owners.append((k, span.call_id))
            sampled.append(sample.token_ids[span.start : span.end])
    texts, encoded, again = _round_trip(tokenizer, sampled)
    for (k, call_id), ids, text, new_ids, new_text in zip(
        owners, sampled, texts, encoded, again, strict=True
    ):
        kind, affected = _classify(ids, text, new_ids, new_text)
        measured[k].calls.append((int(ids.shape[0]), kind, affected))
        if kind is not None:
            _example(measured[k], "call", batch[k], call_id, ids, new_ids, tokenizer, budget)
    if whole_sequences:
        sequences = [s.token_ids for s in batch]
        texts, encoded, again = _round_trip(tokenizer, sequences)
        for k, (ids, text, new_ids, new_text) in enumerate(
            zip(sequences, texts, encoded, again, strict=True)
        ):
            kind, affected = _classify(ids, text, new_ids, new_text)
            measured[k].sequence = (int(ids.shape[0]), kind, affected)
    if renderer is not None:
        for sample, one in zip(batch, measured, strict=True):
            _rerender(sample, renderer, tokenizer, one, budget)
    return measured


def _classify(ids: IdArray, text: str, new_ids: IdArray, new_text: str) -> tuple[str | None, int]:
    if ids.shape == new_ids.shape and bool(np.array_equal(ids, new_ids)):
        return None, 0
    affected = int(ids.shape[0]) - common_prefix_len(ids, new_ids)
    kind = "retokenized" if new_text == text and "\ufffd" not in text else "lossy_text"
    return kind, max(affected, 1)


def _rerender(
    sample: Sample,
    renderer: TemplateRenderer,
    tokenizer: Any,
    measured: SampleDrift,
    budget: list[int],
) -> None:
    requests = captured_requests(sample)
    for span in sample.spans:
        request = requests.get(span.call_id)
        if request is None:
            continue
        messages, tools = request
        try:
            text = renderer.render(messages, tools=tools, add_generation_prompt=True)
        except RenderRefused:
            measured.rerender_refused += 1
            continue
        prompt = sample.token_ids[: span.start]
        rendered = renderer.encode(text)
        if rendered.shape == prompt.shape and bool(np.array_equal(rendered, prompt)):
            measured.rerender.append((int(prompt.shape[0]), None, 0))
            continue
        affected = int(prompt.shape[0]) - common_prefix_len(prompt, rendered)
        old_text = tokenizer.decode(prompt.tolist(), skip_special_tokens=False)
        if old_text == text:
            kind = "retokenized"
        elif normalize_template_text(old_text) == normalize_template_text(text):
            kind = "template_rerender"
        else:
            kind = "content"
        measured.rerender.append((int(prompt.shape[0]), kind, max(affected, 1)))
        _example(measured, "template", sample, span.call_id, prompt, rendered, tokenizer, budget)


def _example(
    measured: SampleDrift,
    where: str,
    sample: Sample,
    call_id: str,
    ids: IdArray,
    new_ids: IdArray,
    tokenizer: Any,
    budget: list[int],
) -> None:
    if budget[0] <= 0:
        return
    budget[0] -= 1
    p = common_prefix_len(ids, new_ids)
    lo = max(0, p - 2)

    def pieces(values: IdArray) -> list[str]:
        return [
            tokenizer.decode([int(i)], skip_special_tokens=False) for i in values[lo : p + _EXCERPT]
        ]

    measured.examples.append(
        {
            "where": where,
            "sample_id": sample.sample_id,
            "call_id": call_id,
            "position": p,
            "captured": pieces(ids),
            "captured_ids": ids[lo : p + _EXCERPT].tolist(),
            "re_encoded": pieces(new_ids),
            "re_encoded_ids": new_ids[lo : p + _EXCERPT].tolist(),
        }
    )


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "drift",
        help="how many calls, samples and tokens would drift under decode->encode or re-rendering",
        description="Count what re-tokenizing text (instead of keeping the sampled ids) would change.",
    )
    parser.add_argument("samples_file", help="a samples file written by any sink")
    parser.add_argument(
        "--tokenizer",
        required=True,
        metavar="DIR_OR_GGUF",
        help="the model's tokenizer: a local folder or a GGUF file",
    )
    parser.add_argument(
        "--chat-template",
        metavar="FILE",
        help=(
            "the template the server rendered prompts with, to re-render captured messages: a "
            "Jinja file, a tokenizer folder or GGUF file, or 'tokenizer' for the --tokenizer's own "
            "(not measured without it)"
        ),
    )
    parser.add_argument(
        "--calls-only",
        action="store_true",
        help="skip the whole-sequence round trip (faster on long samples)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--progress", action="store_true", help="draw progress even when not a TTY")
    parser.add_argument("--allow-truncated", action="store_true", help="skip a torn last line")
    parser.add_argument("--fail-on-drift", action="store_true", help="exit 1 when any call drifted")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    samples = open_samples_file(args.samples_file, allow_truncated=args.allow_truncated)
    tokenizer = load_tokenizer(args.tokenizer)
    renderer = _renderer(args, tokenizer)
    # spans a trainer cannot correct: warned about below
    sampling = sampling_report.SamplingCounts()
    with Progress(
        "drift",
        enabled=progress_enabled(args.progress),
        total=samples.estimated_samples,
        estimated=not samples.count_is_exact,
    ) as progress:
        report = measure_drift(
            sampling_report.counting(samples, sampling),
            tokenizer,
            renderer=renderer,
            whole_sequences=not args.calls_only,
            progress=progress,
        )
    if report.sequences.scanned == 0:
        raise CliInputError(
            samples.path, "holds no samples (an empty file: did the run write anything yet?)"
        )
    data = {
        "file": str(samples.path),
        "tokenizer": str(args.tokenizer),
        "chat_template": None if renderer is None else renderer.origin,
        **report.to_dict(),
        "sampling": sampling.to_dict(),
    }
    if args.json:
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        warnings = sampling_report.warnings(data["sampling"])
        sys.stdout.write("\n".join([format_drift(data), *warnings]) + "\n")
    drifted = report.calls.drifted > 0
    return EXIT_FINDINGS if drifted and args.fail_on_drift else EXIT_OK


TOKENIZER_TEMPLATE = "tokenizer"
"""`--chat-template tokenizer`: the tokenizer folder's own template (only when the server renders
with it, i.e. was started without `--chat-template`)."""


def _renderer(args: argparse.Namespace, tokenizer: Any) -> TemplateRenderer | None:
    """The template that re-renders captured messages: only the one named by `--chat-template`.

    The samples do not say which template the server rendered with (vLLM's `--chat-template` may
    replace the tokenizer's own), so the check runs only against a template the user names: a
    Jinja file, a tokenizer folder or GGUF file (its template), or `tokenizer` for the
    `--tokenizer`'s own. Anything that is not a chat template (empty, does not compile, a JSON
    config, a file that renders no conversation such as an HTML page) is refused (exit 2), never
    measured against.
    """
    if not args.chat_template:
        return None
    if args.chat_template == TOKENIZER_TEMPLATE:
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(own, dict):
            own = own.get("default") or next(iter(own.values()), None)
        if not isinstance(own, str) or not own.strip():
            raise CliInputError(args.tokenizer, "the tokenizer has no chat template of its own")
        origin = f"{args.tokenizer} (its own template)"
        check_compiles(Path(args.tokenizer), own)
        renderer = TemplateRenderer(origin, own, tokenizer, str(args.tokenizer), True)
    else:
        renderer = load_renderer(args.chat_template)  # exists, readable, not JSON, compiles
        renderer.tokenizer = tokenizer  # rendered with the model's tokenizer, as vLLM does
        renderer.tokenizer_origin = str(args.tokenizer)
        renderer.renders_with_tokenizer = True
    check_chat_template(renderer)
    return renderer
