"""`tito-agents audit-template`: prefix preservation of chat templates, text and token level.

Real templates of many model families (shipped by `trl`) are audited at both levels and checked
against an independent rendering; synthetic templates in tests/data/templates fail known cases on
purpose, and the audit must fail exactly those, with the right hint.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_cli_support import TEMPLATES, run_cli, trl_templates
from tito_agents.cli._audit_cases import TOOLS, AuditCase, all_cases, conversation
from tito_agents.cli._render import PLACEHOLDER_SPECIAL_TOKENS, load_renderer
from tito_agents.cli.audit import AuditReport, CaseResult, audit_template
from tito_agents.testing.smollm2 import load_tokenizer, tokenizer_dir

Predicate = Callable[[AuditCase], bool]


def _never(case: AuditCase) -> bool:
    return False


SYNTHETIC: dict[str, tuple[Predicate, str | None]] = {
    "prefix_preserving": (_never, None),
    "lookahead_tool": (lambda c: c.appended == "tool", "text_inserted"),
    "lookahead_user": (lambda c: c.appended == "user", "text_inserted"),
    "lookahead_system": (lambda c: c.appended == "system", "text_inserted"),
    "lookahead_assistant": (lambda c: c.appended == "assistant", "text_inserted"),
    "generation_prompt_mismatch": (lambda c: c.check == "generation", "generation_prompt_mismatch"),
    "reasoning_last_turn_only": (
        lambda c: c.check == "append" and c.reasoning,
        "reasoning_dropped",
    ),
    "tool_calls_last_turn_only": (
        lambda c: c.check == "append" and c.tool_calls,
        "tool_call_rerendered",
    ),
    "final_turn_terminator": (lambda c: c.check == "append", "final_turn_terminator"),
    "system_hoisted": (lambda c: c.appended == "system", "system_hoisted"),
    "tools_before_last_user": (
        lambda c: c.tools and c.appended == "user",
        "earlier_turn_rewritten",
    ),
    "token_boundary": (_never, None),  # text level: the texts do extend
}
"""Template -> (which cases it fails at text level, the hint those failures get)."""


def _failed(report: AuditReport) -> set[str]:
    return {r.case.case_id for r in report.results if r.verdict == "fail"}


def _expected(predicate: Predicate) -> set[str]:
    return {c.case_id for c in all_cases() if predicate(c)}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_template_fails_exactly_its_cases(name: str) -> None:
    """Each synthetic template fails exactly the cases it breaks on purpose, each with its hint and
    the first diverging position shown."""
    predicate, hint = SYNTHETIC[name]
    report = audit_template(load_renderer(TEMPLATES / f"{name}.jinja"))
    assert _failed(report) == _expected(predicate)
    for result in report.results:
        if result.verdict == "fail":
            assert result.level == "text" and result.position is not None
            assert (
                result.context is not None and result.context["earlier"] != result.context["later"]
            )
            assert result.hint is not None and result.hint.code == hint, result.case.case_id


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_templates_at_token_level(name: str) -> None:
    """With the SmolLM2 tokenizer the same cases fail at text level; the newline template also fails
    every append case at token level (its texts extend, its ids do not)."""
    predicate, _ = SYNTHETIC[name]
    report = audit_template(load_renderer(TEMPLATES / f"{name}.jinja", tokenizer=tokenizer_dir()))
    assert report.token_level
    text_failures = {r.case.case_id for r in report.results if r.level == "text"}
    assert text_failures == _expected(predicate)
    token_failures = {r.case.case_id for r in report.results if r.verdict == "fail"} - text_failures
    if name == "token_boundary":
        assert token_failures == _expected(lambda c: c.check == "append")
        for result in report.results:
            if result.verdict == "fail":
                assert result.hint is not None and result.hint.code == "token_boundary"
                assert result.context is not None
                assert result.context["earlier_ids"] != result.context["later_ids"]
    else:
        assert token_failures == set()


TRL = trl_templates()


def _independent_render(
    template: str, messages: list[dict[str, Any]], case: AuditCase, gen: bool
) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    render: Any = render_jinja_template
    rendered, _ = render(
        conversations=[messages],
        tools=TOOLS if case.tools else None,
        chat_template=template,
        add_generation_prompt=gen,
        **PLACEHOLDER_SPECIAL_TOKENS,
    )
    return str(rendered[0])


@pytest.fixture(scope="module")
def smollm2() -> Any:
    return load_tokenizer()


def _renderings(template: str, result: CaseResult) -> tuple[str, str]:
    """The case's two renderings, made directly through transformers (the independent oracle)."""
    assert result.dialect_used is not None
    case = result.case
    earlier_messages, later_messages = conversation(case, result.dialect_used)
    earlier = _independent_render(template, earlier_messages, case, case.check == "generation")
    later = _independent_render(
        template, later_messages, case, case.check == "append" and case.appended != "assistant"
    )
    return earlier, later


@pytest.mark.parametrize("path", TRL, ids=[p.stem for p in TRL])
def test_trl_template_text_and_token_level(path: Path, smollm2: Any) -> None:
    """Every real template renders a basic chat. Text level: each verdict and first diverging
    position agree with rendering the same messages directly through transformers. Token level
    (SmolLM2): text failures stay text failures, every other case is decided on ids, and agrees
    with encoding both renderings with the tokenizer directly."""
    text_report = audit_template(load_renderer(path))
    token_report = audit_template(load_renderer(path, tokenizer=tokenizer_dir()))
    assert len(text_report.results) == len(all_cases())
    assert any(r.verdict != "unsupported" for r in text_report.results)
    template = path.read_text(encoding="utf-8")
    for text, tokens in zip(text_report.results, token_report.results, strict=True):
        assert text.case == tokens.case
        if text.verdict == "unsupported":
            assert text.error and tokens.verdict == "unsupported"
            continue
        earlier, later = _renderings(template, text)
        assert (text.verdict == "pass") == later.startswith(earlier), text.case.case_id
        if text.verdict == "fail":
            p = text.position
            assert p is not None and earlier[:p] == later[:p]
            assert p == min(len(earlier), len(later)) or earlier[p] != later[p]
            assert (tokens.verdict, tokens.level) == ("fail", "text")
            continue
        assert tokens.level == "tokens"
        earlier_ids = smollm2(earlier, add_special_tokens=False)["input_ids"]
        later_ids = smollm2(later, add_special_tokens=False)["input_ids"]
        assert (tokens.verdict == "pass") == (later_ids[: len(earlier_ids)] == earlier_ids)
        if tokens.verdict == "fail":
            assert tokens.context is not None and tokens.position is not None
            assert tokens.context["earlier_ids"][0] == earlier_ids[tokens.position]


def _report(name: str, tokenizer: Path | None = None) -> AuditReport:
    paths = {p.stem: p for p in TRL}
    return audit_template(load_renderer(paths[name], tokenizer=tokenizer))


def test_qwen3_drops_reasoning_and_its_training_template_does_not() -> None:
    """Qwen3 renders reasoning only on the last turn (a documented break, with its hint); trl's
    prefix-preserving training variant passes every case."""
    qwen3 = {r.case.case_id: r for r in _report("qwen3").results}
    dropped = qwen3["tool_calls+reasoning:+user"]
    assert dropped.verdict == "fail" and dropped.hint is not None
    assert dropped.hint.code == "reasoning_dropped"
    assert "<think>" in dropped.context["earlier"]  # type: ignore[index]
    assert _report("qwen3_training").passed


def test_deepseek_r1_generation_prompt_opens_a_reasoning_block() -> None:
    """DeepSeek-R1-Distill prefills `<think>` and re-renders turns without it: the generation checks
    fail with the reasoning hint."""
    report = _report("deepseek_r1_distill")
    generation = [r for r in report.results if r.case.check == "generation"]
    assert generation and all(r.verdict == "fail" for r in generation)
    assert {r.hint.code for r in generation if r.hint} == {"reasoning_in_generation_prompt"}


def test_template_refusals_are_not_failures() -> None:
    """Gemma refuses system messages and non-alternating roles: those cases are reported as not
    supported, with the template's own message, and never as failures."""
    report = _report("gemma")
    refused = [r for r in report.results if r.verdict == "unsupported"]
    assert {r.case.appended for r in refused} == {"system", "assistant", "tool"}
    assert all(
        "System role not supported" in (r.error or "") or "must alternate" in (r.error or "")
        for r in refused
    )
    assert report.counts()["fail"] == 0


def test_tokenizer_folder_is_its_own_tokenizer(capsys: pytest.CaptureFixture[str]) -> None:
    """A tokenizer folder is audited with its own template at token level (SmolLM2's passes)."""
    code, out, _ = run_cli(["audit-template", tokenizer_dir(), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["level"] == "tokens" and data["passed"]
    assert data["summary"]["pass"] == len(all_cases())


def test_gguf_file(capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF file is read with transformers' GGUF support: its template and tokenizer are audited."""
    from tito_agents.testing.smollm2 import GGUF_FILE, _gguf_folder

    gguf = _gguf_folder() / GGUF_FILE
    code, out, _ = run_cli(["audit-template", gguf, "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["level"] == "tokens" and data["template"] == str(gguf)
    assert data["summary"]["fail"] == 0


def test_json_output_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """--json lists every case with verdict, position, context and hint; exit 1 when a case fails,
    0 when none does."""
    code, out, _ = run_cli(["audit-template", TEMPLATES / "system_hoisted.jinja", "--json"], capsys)
    data = json.loads(out)
    assert code == 1 and not data["passed"]
    assert len(data["cases"]) == len(all_cases())
    assert data["summary"]["fail"] == sum(c["verdict"] == "fail" for c in data["cases"])
    failed = [c for c in data["cases"] if c["verdict"] == "fail"]
    assert all(c["appended"] == "system" and c["hint"]["code"] == "system_hoisted" for c in failed)
    assert all(c["position"] is not None and c["context"]["later"] for c in failed)
    code, _, _ = run_cli(
        ["audit-template", TEMPLATES / "prefix_preserving.jinja", "--json"], capsys
    )
    assert code == 0


def test_text_report_groups_failures(capsys: pytest.CaptureFixture[str]) -> None:
    """The text report shows the verdict grid, each distinct failure once with its cases, the
    context around the first difference, the hint and the totals."""
    code, out, _ = run_cli(
        ["audit-template", TEMPLATES / "reasoning_last_turn_only.jinja", "--color", "never"], capsys
    )
    assert code == 1
    assert "assistant turn" in out and "+assistant" in out
    assert "failure 1:" in out and "hint [reasoning_dropped]" in out
    assert "earlier: '<think>" in out
    assert "FAIL: 22 pass, 14 fail, 0 not supported by the template" in out


def test_template_kwargs_reach_the_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--template-kwargs passes variables to the template (here: one it refuses to render without)."""
    source = (TEMPLATES / "prefix_preserving.jinja").read_text()
    path = tmp_path / "needs_flag.jinja"
    path.write_text(
        "{%- if not audit_flag %}{{ raise_exception('audit_flag missing') }}{%- endif %}" + source
    )
    code, _, err = run_cli(["audit-template", path], capsys)
    assert code == 2 and "audit_flag missing" in err
    code, _, _ = run_cli(
        ["audit-template", path, "--template-kwargs", '{"audit_flag": true}'], capsys
    )
    assert code == 0
    code, _, err = run_cli(["audit-template", path, "--template-kwargs", "[1]"], capsys)
    assert code == 2 and "JSON object" in err
