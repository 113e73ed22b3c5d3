"""`tito-agents audit-template`: does a chat template let multi-turn samples merge?

Merging needs prefix preservation: each call's prompt must start with the previous call's prompt and
sampled ids. For every case in `_audit_cases` the template renders an earlier and a later conversation
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
from tito_agents.cli._audit_cases import (
    TOOLS,
    AuditCase,
    Dialect,
    all_cases,
    conversation,
    dialects,
)
from tito_agents.cli._audit_format import format_report
from tito_agents.cli._audit_hints import Mismatch, find_hint, marker_start
from tito_agents.cli._audit_report import AuditReport, CaseResult
from tito_agents.cli._errors import EXIT_FINDINGS, EXIT_OK, CliInputError
from tito_agents.cli._render import RenderRefused, TemplateRenderer, load_renderer
from tito_agents.cli._term import Painter, color_enabled
from tito_agents.cli._tokenizers import decode_tokens

__all__ = ["AuditReport", "CaseResult", "add_parser", "audit_template", "run"]

_CONTEXT_CHARS = 40
_CONTEXT_TOKENS = 4


def audit_template(
    renderer: TemplateRenderer, cases: Sequence[AuditCase] | None = None
) -> AuditReport:
    """Run every case (default: `all_cases()`) against the renderer's template.

    `CliInputError` when the template renders none of them (it cannot render a basic chat).
    """
    results: list[CaseResult] = []
    preferred: Dialect | None = None
    for case in cases if cases is not None else all_cases():
        result, used = _run_case(renderer, case, preferred)
        preferred = used or preferred
        results.append(result)
    if results and all(r.verdict == "unsupported" for r in results):
        raise CliInputError(renderer.origin, f"template fails to render: {results[0].error}")
    return AuditReport(
        renderer.origin,
        renderer.tokenizer_origin,
        renderer.token_level,
        renderer.template_sha256,
        results,
    )


def _run_case(
    renderer: TemplateRenderer, case: AuditCase, preferred: Dialect | None
) -> tuple[CaseResult, Dialect | None]:
    """Render the case in the first dialect the template accepts and compare the renderings."""
    errors: dict[Dialect, str] = {}
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
        except RenderRefused as exc:
            errors[dialect] = str(exc)
            continue
        result = _compare(renderer, case, dialect, earlier, later)
        return dataclasses.replace(result, dialect_used=dialect), dialect
    # Report what the template said to the spelling the other cases use, else to the standard one.
    error = errors.get(preferred) if preferred is not None else None
    error = error or next((errors[d] for d in dialects() if d in errors), None)
    return CaseResult(case, "unsupported", error=error), None


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
