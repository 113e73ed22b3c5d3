"""The audit's results as data: one `CaseResult` per case, an `AuditReport` per template (what
`audit_template` returns, `format` prints and `--json` writes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tito_agents.cli.audit.cases import AuditCase, Dialect
from tito_agents.cli.audit.hints import Hint

__all__ = ["AuditReport", "CaseResult", "Verdict"]

Verdict = Literal["pass", "fail", "unsupported", "drops"]
"""`pass`; `fail` (prefix not preserved, with a hint when a pattern is known); `unsupported` (not
applicable: the template refuses that conversation, or never renders reasoning); `drops` (the
rendering leaves out content the case sends: a tool call, the tool result, text, reasoning)."""


@dataclass(frozen=True, slots=True)
class CaseResult:
    """The verdict of one case. `position` is a character index (level "text") or a token index
    (level "tokens"); `context` holds what precedes it and what each rendering has there."""

    case: AuditCase
    verdict: Verdict
    level: Literal["text", "tokens"] | None = None
    dialect: str | None = None
    position: int | None = None
    context: dict[str, Any] | None = None
    hint: Hint | None = None
    error: str | None = None
    dialect_used: Dialect | None = None
    """The message spelling the template accepted (`dialect` is its description)."""
    missing: list[str] | None = None
    """`drops`: what the rendering left out ("tool call name", "tool result", ...)."""
    prefix_verdict: Verdict | None = None
    """`drops`: what the prefix comparison alone said ("pass" or "fail")."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.case_id,
            "description": self.case.description,
            "check": self.case.check,
            "tool_calls": self.case.tool_calls,
            "reasoning": self.case.reasoning,
            "tools": self.case.tools,
            "appended": self.case.appended,
            "verdict": self.verdict,
            "level": self.level,
            "dialect": self.dialect,
            "position": self.position,
            "context": self.context,
            "hint": None if self.hint is None else {"code": self.hint.code, "text": self.hint.text},
            "error": self.error,
            "missing": self.missing,
            "prefix_verdict": self.prefix_verdict,
        }


@dataclass(frozen=True, slots=True)
class AuditReport:
    """Every case's verdict for one template."""

    origin: str
    tokenizer_origin: str | None
    token_level: bool
    template_sha256: str
    results: list[CaseResult]
    missing_tokens: list[str] = field(default_factory=list)
    """Token level: markers the template writes that the tokenizer splits into several tokens (it
    is probably not the model's tokenizer; token-level failures may not be real)."""
    renders_reasoning: bool = True
    """Whether the template renders `reasoning_content` at all (else reasoning cases are n/a)."""

    def counts(self) -> dict[str, int]:
        counts = {"pass": 0, "fail": 0, "drops": 0, "unsupported": 0}
        for result in self.results:
            counts[result.verdict] += 1
        return counts

    @property
    def passed(self) -> bool:
        counts = self.counts()
        return counts["fail"] == 0 and counts["drops"] == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.origin,
            "tokenizer": self.tokenizer_origin,
            "level": "tokens" if self.token_level else "text",
            "template_sha256": self.template_sha256,
            "passed": self.passed,
            "summary": self.counts(),
            "missing_tokens": self.missing_tokens,
            "renders_reasoning": self.renders_reasoning,
            "cases": [r.to_dict() for r in self.results],
        }
