"""The audit report as text: a verdict grid, each distinct failure once, refusals, totals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tito_agents.cli._term import Painter
from tito_agents.cli.audit.report import AuditReport, CaseResult

__all__ = ["format_report"]


def format_report(report: AuditReport, paint: Painter, *, verbose: bool = False) -> str:
    """The audit as text: a grid of verdicts per case, then each distinct failure once, with the
    cases it covers, its context and its hint."""
    level = "token level" if report.token_level else "text level (give --tokenizer for tokens)"
    tokenizer = f", tokenizer {report.tokenizer_origin}" if report.tokenizer_origin else ""
    lines = [paint(f"audit-template {report.origin}", "bold") + f"  [{level}{tokenizer}]", ""]
    if report.missing_tokens:
        shown = " ".join(report.missing_tokens[:8]) + (
            " ..." if len(report.missing_tokens) > 8 else ""
        )
        lines += [
            paint("warning: ", "yellow", "bold")
            + f"the tokenizer splits {len(report.missing_tokens)} marker(s) the template writes "
            f"into several tokens: {shown}. It is probably not the model's tokenizer: token-level "
            "failures (token_boundary) may not be real. Give the model's own with --tokenizer.",
            "",
        ]
    lines += _grid(report, paint)
    groups = _failure_groups(report.results)
    for n, group in enumerate(groups, start=1):
        first = group[0]
        where = f"{first.level} position {first.position}"
        names = ", ".join(r.case.case_id for r in group)
        lines += [
            "",
            paint(f"failure {n}: ", "red", "bold") + f"{len(group)} case(s), first "
            f"difference at {where}",
            paint(f"  cases: {names}", "grey"),
        ]
        lines.extend(_context_lines(first, paint))
        if first.hint is not None:
            lines.append(paint(f"  hint [{first.hint.code}]: ", "cyan") + first.hint.text)
    drops: dict[tuple[str, ...], list[CaseResult]] = {}
    for result in report.results:
        if result.verdict == "drops":
            drops.setdefault(tuple(result.missing or ()), []).append(result)
    for missing, group in drops.items():
        names = ", ".join(r.case.case_id for r in group)
        prefix_fails = sum(r.prefix_verdict == "fail" for r in group)
        also = f"; the prefix also breaks in {prefix_fails} (see --json)" if prefix_fails else ""
        lines += [
            "",
            paint("drops content: ", "red", "bold")
            + f"{len(group)} case(s) render without the {', '.join(missing)}{also}",
            paint(f"  cases: {names}", "grey"),
        ]
        hint = group[0].hint
        if hint is not None:
            lines.append(paint(f"  hint [{hint.code}]: ", "cyan") + hint.text)
    refusals: dict[str, list[str]] = {}
    for result in report.results:
        if result.verdict == "unsupported":
            refusals.setdefault(result.error or "", []).append(result.case.case_id)
    for error, refused in refusals.items():
        lines += [
            "",
            paint("not applicable: ", "yellow") + ", ".join(refused),
            paint(
                f"  {'why' if error.startswith('the template never') else 'it raised'}: {error}",
                "grey",
            ),
        ]
    if verbose:
        lines += ["", "dialects used:"]
        lines += [f"  {r.case.case_id}: {r.dialect}" for r in report.results if r.dialect]
    counts = report.counts()
    verdict = paint("PASS", "green", "bold") if report.passed else paint("FAIL", "red", "bold")
    lines += [
        "",
        f"{verdict}: {counts['pass']} pass, {counts['fail']} fail, {counts['drops']} drop content, "
        f"{counts['unsupported']} not applicable",
    ]
    return "\n".join(lines)


_COLUMNS = ("gen", "+tool", "+user", "+system", "+assistant")


def _grid(report: AuditReport, paint: Painter) -> list[str]:
    """One row per assistant-turn shape, one column per check."""
    cells: dict[str, dict[str, str]] = {}
    for result in report.results:
        shape, action = result.case.case_id.split(":")
        cells.setdefault(shape, {})[action] = result.verdict
    width = max(len(shape) for shape in cells)
    marks = {
        "pass": ("pass", "green"),
        "fail": ("FAIL", "red"),
        "drops": ("DROPS", "red"),
        "unsupported": ("n/a", "yellow"),
    }
    header = "assistant turn".ljust(width) + "  " + "  ".join(c.ljust(10) for c in _COLUMNS)
    lines = [header.rstrip(), "-" * len(header.rstrip())]
    for shape, row in cells.items():
        parts = []
        for column in _COLUMNS:
            verdict = row.get(column)
            if verdict is None:
                parts.append("-".ljust(10))
            else:
                text, colour = marks[verdict]
                parts.append(paint(text, colour) + " " * (10 - len(text)))
        lines.append((shape.ljust(width) + "  " + "  ".join(parts)).rstrip())
    return lines


def _failure_groups(results: Sequence[CaseResult]) -> list[list[CaseResult]]:
    """Failed cases grouped by what they show (same context and hint): one block per problem."""
    groups: dict[tuple[Any, ...], list[CaseResult]] = {}
    for result in results:
        if result.verdict != "fail" or result.context is None:
            continue
        ctx = result.context
        key = (
            result.level,
            None if result.hint is None else result.hint.code,
            repr(ctx.get("earlier")),
            repr(ctx.get("later")),
            repr(ctx.get("before"))[-24:],
        )
        groups.setdefault(key, []).append(result)
    return list(groups.values())


def _context_lines(result: CaseResult, paint: Painter) -> list[str]:
    ctx = result.context or {}
    if result.level == "tokens":

        def show(tokens: list[str]) -> str:
            return " ".join(repr(t) for t in tokens) or "(end)"

        return [
            f"  before:  …{show(ctx['before'])}",
            "  earlier: " + paint(show(ctx["earlier"]), "yellow") + f"  ids {ctx['earlier_ids']}",
            "  later:   " + paint(show(ctx["later"]), "magenta") + f"  ids {ctx['later_ids']}",
        ]
    return [
        f"  before:  …{ctx['before']!r}",
        "  earlier: " + paint(repr(ctx["earlier"]) if ctx["earlier"] else "(end)", "yellow"),
        "  later:   " + paint(repr(ctx["later"]) if ctx["later"] else "(end)", "magenta"),
    ]
