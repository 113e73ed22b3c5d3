"""`tito-agents audit-template`: does a chat template let multi-turn samples merge?

Merging needs prefix preservation: each call's prompt must start with the previous call's prompt and
sampled ids. For every case in `cases` the template renders an earlier and a later conversation
and the later rendering must extend the earlier one, text for text (a cheap first pass, no tokenizer
needed) and then token for token (with a tokenizer: encoded as vLLM encodes a chat prompt). A failed
case reports the first diverging position with the text or decoded tokens around it, and a fix hint
when a known pattern applies. Exit code 0 when no case fails, 1 when one does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from tito_agents.assembly.divergence import common_prefix_len
from tito_agents.cli._errors import EXIT_FINDINGS, EXIT_OK, CliInputError
from tito_agents.cli._input_checks import TemplateProbe, probe_template
from tito_agents.cli._templates import load_renderer
from tito_agents.cli._term import Painter, color_enabled
from tito_agents.cli._tokenizers import decode_tokens
from tito_agents.cli.audit.cases import (
    TOOLS,
    AuditCase,
    Dialect,
    all_cases,
    conversation,
    dialects,
    expected_content,
    head,
)
from tito_agents.cli.audit.format import format_report
from tito_agents.cli.audit.hints import Mismatch, content_hint, find_hint, marker_start
from tito_agents.cli.audit.report import AuditReport, CaseResult
from tito_agents.cli.audit.tokens import missing_tokens
from tito_agents.token_codec import RenderRefused, TemplateRenderer

__all__ = [
    "AuditReport",
    "CaseResult",
    "add_parser",
    "audit_template",
    "run",
]

_CONTEXT_CHARS = 40
_CONTEXT_TOKENS = 4


def audit_template(
    renderer: TemplateRenderer, cases: Sequence[AuditCase] | None = None
) -> AuditReport:
    """Run every case (default: `all_cases()`) against the renderer's template.

    `CliInputError` when the template cannot render a basic chat, or renders it without the
    conversation in it (an empty shell, or a file that is not a chat template at all).
    """
    probe = probe_template(renderer)
    results: list[CaseResult] = []
    preferred: Dialect | None = None
    seen: list[str] = []
    for case in cases if cases is not None else all_cases():
        result, used = _run_case(renderer, case, preferred, probe, seen)
        preferred = used or preferred
        results.append(result)
    missing = missing_tokens(renderer, seen) if renderer.token_level else []
    return AuditReport(
        renderer.origin,
        renderer.tokenizer_origin,
        renderer.token_level,
        renderer.template_sha256,
        results,
        missing_tokens=missing,
        renders_reasoning=probe.renders_reasoning,
    )


def _run_case(
    renderer: TemplateRenderer,
    case: AuditCase,
    preferred: Dialect | None,
    probe: TemplateProbe,
    seen: list[str],
) -> tuple[CaseResult, Dialect | None]:
    """Render the case in the first dialect whose renderings show its content and compare them.

    A template that renders every dialect without some of the content (tool calls, the tool
    result, reasoning...) gets `drops`, judged on the first dialect it rendered. Reasoning cases of
    a template that never renders reasoning are not applicable.
    """
    if case.reasoning and not probe.renders_reasoning:
        return CaseResult(case, "unsupported", error=_NO_REASONING), None
    errors: dict[Dialect, str] = {}
    dropped: tuple[Dialect, str, str, list[str]] | None = None
    candidates = [preferred] if preferred is not None else []
    candidates += [d for d in dialects() if d != preferred]
    for dialect in candidates:
        earlier_messages, later_messages = conversation(case, dialect)
        tools = _tools(case)
        try:
            earlier = renderer.render(
                earlier_messages, tools=tools, add_generation_prompt=case.check == "generation"
            )
            later = renderer.render(
                later_messages,
                tools=tools,
                add_generation_prompt=case.check == "append" and case.appended != "assistant",
            )
            without_turn = (
                earlier
                if case.check == "generation"
                else renderer.render(head(dialect), tools=tools, add_generation_prompt=True)
            )
        except RenderRefused as exc:
            errors[dialect] = str(exc)
            continue
        seen.extend((earlier, later))
        missing = _missing_content(case, dialect, without_turn, earlier, later)
        if missing:
            if dropped is None or len(missing) < len(dropped[3]):
                dropped = (dialect, earlier, later, missing)  # the spelling that shows the most
            continue
        result = _compare(renderer, case, dialect, earlier, later)
        return dataclasses.replace(result, dialect_used=dialect), dialect
    if dropped is not None:
        dialect, earlier, later, missing = dropped
        compared = _compare(renderer, case, dialect, earlier, later)
        result = dataclasses.replace(
            compared,
            verdict="drops",
            missing=missing,
            prefix_verdict=compared.verdict,
            hint=content_hint(case, missing),
            dialect_used=dialect,
        )
        return result, None
    # Report what the template said to the spelling the other cases use, else to the standard one.
    error = errors.get(preferred) if preferred is not None else None
    error = error or next((errors[d] for d in dialects() if d in errors), None)
    return CaseResult(case, "unsupported", error=error), None


_NO_REASONING = (
    "the template never renders reasoning_content (no reasoning support): reasoning cases do not "
    "apply"
)


def _missing_content(
    case: AuditCase, dialect: Dialect, without_turn: str, earlier: str, later: str
) -> list[str]:
    """Labels of the content the case adds that its rendering does not show (each label once)."""
    with_turn = later if case.check == "generation" else earlier
    missing: list[str] = []
    for content in expected_content(case, dialect):
        before, after = (without_turn, with_turn) if content.part == "turn" else (earlier, later)
        if after.count(content.text) <= before.count(content.text) and content.label not in missing:
            missing.append(content.label)
    return missing


def _tools(case: AuditCase) -> list[dict[str, Any]] | None:
    return TOOLS if case.tools else None


def _compare(
    renderer: TemplateRenderer, case: AuditCase, dialect: Dialect, earlier: str, later: str
) -> CaseResult:
    spelled = dialect.describe()
    if not later.startswith(earlier):
        p = _first_difference(earlier, later)
        split = marker_start(earlier, p)  # show a marker like `</s>` whole, not cut at `/`
        context = {
            "before": earlier[max(0, split - _CONTEXT_CHARS) : split],
            "earlier": earlier[split : split + _CONTEXT_CHARS],
            "later": later[split : split + _CONTEXT_CHARS],
        }
        hint = find_hint(Mismatch(case, earlier, later, p, token_level=False))
        return CaseResult(case, "fail", "text", spelled, p, context, hint)
    if not renderer.token_level:
        return CaseResult(case, "pass", "text", spelled)
    earlier_ids = renderer.encode(earlier)
    later_ids = renderer.encode(later)
    p = common_prefix_len(earlier_ids, later_ids)
    if p == earlier_ids.shape[0]:
        return CaseResult(case, "pass", "tokens", spelled)
    tokenizer: Any = renderer.tokenizer
    around: dict[str, Any] = {
        "before": decode_tokens(tokenizer, earlier_ids[max(0, p - _CONTEXT_TOKENS) : p]),
        "earlier": decode_tokens(tokenizer, earlier_ids[p : p + _CONTEXT_TOKENS]),
        "later": decode_tokens(tokenizer, later_ids[p : p + _CONTEXT_TOKENS]),
        "earlier_ids": earlier_ids[p : p + _CONTEXT_TOKENS].tolist(),
        "later_ids": later_ids[p : p + _CONTEXT_TOKENS].tolist(),
    }
    char_position = len(tokenizer.decode(earlier_ids[:p].tolist(), skip_special_tokens=False))
    mismatch = Mismatch(
        case,
        earlier,
        later,
        min(char_position, len(earlier)),
        token_level=True,
        earlier_token="".join(around["earlier"][:1]),
        later_token="".join(around["later"][:1]),
    )
    return CaseResult(case, "fail", "tokens", spelled, p, around, find_hint(mismatch))


def _first_difference(earlier: str, later: str) -> int:
    n = min(len(earlier), len(later))
    for i in range(n):
        if earlier[i] != later[i]:
            return i
    return n


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit-template",
        help="check that a chat template preserves prefixes (lets multi-turn samples merge)",
        description=(
            "Render conversations ending in an assistant turn, append each role, and check the "
            "longer rendering extends the shorter one, text for text and token for token."
        ),
    )
    parser.add_argument(
        "source",
        metavar="MODEL_DIR_OR_FILE",
        help="a local tokenizer folder, a GGUF file, or a bare Jinja chat template",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR_OR_GGUF",
        help="tokenizer for the token-level audit (a folder or GGUF is its own tokenizer)",
    )
    parser.add_argument(
        "--template-kwargs",
        metavar="JSON",
        default=None,
        help="extra template variables, e.g. '{\"enable_thinking\": false}'",
    )
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("-v", "--verbose", action="store_true", help="list passing cases too")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    kwargs = _template_kwargs(args.template_kwargs)
    renderer = load_renderer(args.source, tokenizer=args.tokenizer, template_kwargs=kwargs)
    report = audit_template(renderer)
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        paint = Painter(color_enabled(args.color))
        sys.stdout.write(format_report(report, paint, verbose=args.verbose) + "\n")
    return EXIT_OK if report.passed else EXIT_FINDINGS


def _template_kwargs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CliInputError(None, f"--template-kwargs is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CliInputError(None, "--template-kwargs must be a JSON object")
    return value
