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

from tests.support.cli_samples import TEMPLATES, run_cli, trl_templates
from tito_agents.cli._templates import load_renderer
from tito_agents.cli._term import Painter
from tito_agents.cli.audit.cases import (
    TOOLS,
    AuditCase,
    all_cases,
    conversation,
    expected_content,
    head,
)
from tito_agents.cli.audit.command import AuditReport, CaseResult, audit_template
from tito_agents.cli.audit.format import format_report
from tito_agents.testing.smollm2 import TOOLS_TEMPLATE_PATH, load_tokenizer, tokenizer_dir
from tito_agents.token_codec import PLACEHOLDER_SPECIAL_TOKENS

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
    template: str,
    messages: list[dict[str, Any]],
    case: AuditCase,
    gen: bool,
    tokenizer: Any | None = None,
) -> str:
    """The rendering straight through transformers: the tokenizer's `apply_chat_template` when a
    tokenizer is given (as vLLM renders `--chat-template`), else `render_jinja_template`."""
    tools = TOOLS if case.tools else None
    if tokenizer is not None:
        text = tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=template, add_generation_prompt=gen, tokenize=False
        )
        return str(text)
    from transformers.utils.chat_template_utils import render_jinja_template

    render: Any = render_jinja_template
    rendered, _ = render(
        conversations=[messages],
        tools=tools,
        chat_template=template,
        add_generation_prompt=gen,
        **PLACEHOLDER_SPECIAL_TOKENS,
    )
    return str(rendered[0])


@pytest.fixture(scope="module")
def smollm2() -> Any:
    return load_tokenizer()


def _renderings(
    template: str, result: CaseResult, tokenizer: Any | None = None
) -> tuple[str, str, str]:
    """The case's renderings (earlier, later, and the one without the assistant turn), made
    directly through transformers (the independent oracle)."""
    assert result.dialect_used is not None
    case = result.case
    earlier_messages, later_messages = conversation(case, result.dialect_used)
    earlier = _independent_render(
        template, earlier_messages, case, case.check == "generation", tokenizer
    )
    later = _independent_render(
        template,
        later_messages,
        case,
        case.check == "append" and case.appended != "assistant",
        tokenizer,
    )
    without_turn = earlier
    if case.check == "append":
        without_turn = _independent_render(
            template, head(result.dialect_used), case, True, tokenizer
        )
    return earlier, later, without_turn


def _shown(result: CaseResult, earlier: str, later: str, without_turn: str) -> set[str]:
    """Labels of the case's content the renderings show (counted as the audit documents)."""
    assert result.dialect_used is not None
    with_turn = later if result.case.check == "generation" else earlier
    missing = set()
    for content in expected_content(result.case, result.dialect_used):
        before, after = (without_turn, with_turn) if content.part == "turn" else (earlier, later)
        if after.count(content.text) <= before.count(content.text):
            missing.add(content.label)
    return missing


def _check_against_oracle(result: CaseResult, template: str, tokenizer: Any | None) -> None:
    """One case's verdict agrees with rendering (and encoding) its messages directly."""
    earlier, later, without_turn = _renderings(template, result, tokenizer)
    missing = _shown(result, earlier, later, without_turn)
    assert (result.verdict == "drops") == bool(missing), result.case.case_id
    if result.verdict == "drops":
        assert set(result.missing or ()) == missing
    prefix = result.prefix_verdict if result.verdict == "drops" else result.verdict
    if not later.startswith(earlier):
        assert (prefix, result.level) == ("fail", "text"), result.case.case_id
        p = result.position
        assert p is not None and earlier[:p] == later[:p]
        assert p == min(len(earlier), len(later)) or earlier[p] != later[p]
        return
    if tokenizer is None:
        assert prefix == "pass", result.case.case_id
        return
    assert result.level == "tokens"
    earlier_ids = tokenizer(earlier, add_special_tokens=False)["input_ids"]
    later_ids = tokenizer(later, add_special_tokens=False)["input_ids"]
    assert (prefix == "pass") == (later_ids[: len(earlier_ids)] == earlier_ids)
    if prefix == "fail":
        assert result.context is not None and result.position is not None
        assert result.context["earlier_ids"][0] == earlier_ids[result.position]


@pytest.mark.parametrize("path", TRL, ids=[p.stem for p in TRL])
def test_trl_template_text_and_token_level(path: Path, smollm2: Any) -> None:
    """Every real template renders a basic chat. At text level (placeholder special tokens) and at
    token level (rendered and encoded with SmolLM2's tokenizer), each verdict, first diverging
    position and missing content agrees with rendering the same messages directly through
    transformers; refusals are refusals at both levels."""
    text_report = audit_template(load_renderer(path))
    token_report = audit_template(load_renderer(path, tokenizer=tokenizer_dir()))
    assert len(text_report.results) == len(all_cases())
    assert any(r.verdict != "unsupported" for r in text_report.results)
    template = path.read_text(encoding="utf-8")
    for text, tokens in zip(text_report.results, token_report.results, strict=True):
        assert text.case == tokens.case
        assert (text.verdict == "unsupported") == (tokens.verdict == "unsupported")
        if text.verdict == "unsupported":
            assert text.error and tokens.error
            continue
        _check_against_oracle(text, template, None)
        _check_against_oracle(tokens, template, smollm2)


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
    """DeepSeek-R1-Distill prefills `<think>` and re-renders turns without it: every generation
    check fails its prefix comparison, plain turns with the reasoning hint."""
    report = _report("deepseek_r1_distill")
    generation = [
        r for r in report.results if r.case.check == "generation" and r.verdict != "unsupported"
    ]
    assert generation
    assert all(r.verdict == "fail" or r.prefix_verdict == "fail" for r in generation)
    failed = [r for r in generation if r.verdict == "fail"]
    assert failed and {r.hint.code for r in failed if r.hint} == {"reasoning_in_generation_prompt"}
    # It renders no tool calls either (trl's supports_tool_calling says the same).
    dropped = [r for r in generation if r.verdict == "drops"]
    assert dropped and all(r.case.tool_calls for r in dropped)
    text = format_report(report, Painter(False))
    breaks = sum(r.prefix_verdict == "fail" for r in report.results if r.verdict == "drops")
    assert breaks and f"the prefix also breaks in {breaks} (see --json)" in text


def test_template_refusals_are_not_failures() -> None:
    """Gemma refuses system messages and non-alternating roles: those cases are not applicable,
    with the template's own message, never failures; it has no reasoning support, so reasoning
    cases are not applicable either; and it never renders tool calls, which the audit reports as
    dropped content."""
    report = _report("gemma")
    raised = [r for r in report.results if r.verdict == "unsupported" and not r.case.reasoning]
    assert {r.case.appended for r in raised} == {"system", "assistant", "tool"}
    assert all(
        "System role not supported" in (r.error or "") or "must alternate" in (r.error or "")
        for r in raised
    )
    reasoning = [r for r in report.results if r.case.reasoning]
    assert not report.renders_reasoning
    assert all(r.verdict == "unsupported" and "reasoning" in (r.error or "") for r in reasoning)
    assert report.counts()["fail"] == 0
    drops = [r for r in report.results if r.verdict == "drops"]
    assert drops and all(r.case.tool_calls and "tool call name" in (r.missing or []) for r in drops)


def test_tokenizer_folder_is_its_own_tokenizer(capsys: pytest.CaptureFixture[str]) -> None:
    """A tokenizer folder is audited with its own template at token level. SmolLM2's own template
    renders no tool calls (every tool-call case drops content, exit 1); the tools template the
    project's vLLM serves with passes every case that applies, with the folder as tokenizer."""
    code, out, _ = run_cli(["audit-template", tokenizer_dir(), "--json"], capsys)
    data = json.loads(out)
    assert code == 1 and data["level"] == "tokens" and not data["passed"]
    dropped = [c for c in data["cases"] if c["verdict"] == "drops"]
    assert {c["case"] for c in dropped} == {
        c.case_id for c in all_cases() if c.tool_calls and not c.reasoning
    }
    assert all(c["missing"] == ["tool call name", "tool call arguments"] for c in dropped)
    code, out, _ = run_cli(
        ["audit-template", TOOLS_TEMPLATE_PATH, "--tokenizer", tokenizer_dir(), "--json"], capsys
    )
    data = json.loads(out)
    assert code == 0 and data["level"] == "tokens" and data["missing_tokens"] == []
    assert data["summary"]["pass"] == sum(not c.reasoning for c in all_cases())


def test_gguf_file(capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF file is read with transformers' GGUF support: its template and tokenizer are audited
    (SmolLM2's, like its converted folder: no prefix failure, but no tool calls rendered)."""
    from tito_agents.testing.smollm2 import GGUF_FILE, _gguf_folder

    gguf = _gguf_folder() / GGUF_FILE
    code, out, _ = run_cli(["audit-template", gguf, "--json"], capsys)
    data = json.loads(out)
    assert data["level"] == "tokens" and data["template"] == str(gguf)
    # The same template as the converted folder's: no prefix failure, tool calls dropped.
    assert code == 1 and data["summary"]["fail"] == 0 and data["summary"]["drops"] > 0


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
    assert "FAIL: 22 pass, 14 fail, 0 drop content, 0 not applicable" in out


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


DROPPING: dict[str, tuple[Predicate, list[str]]] = {
    "drops_tool_calls": (lambda c: c.tool_calls, ["tool call name", "tool call arguments"]),
    "drops_tool_results": (lambda c: c.appended == "tool", ["tool result"]),
}
"""Template -> (which cases drop content, what they leave out); every other case passes."""


@pytest.mark.parametrize("name", sorted(DROPPING))
def test_templates_that_drop_content_fail(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Prefix-preserving templates that leave the tool call or the tool result out of the
    rendering do not pass: exactly those cases are `drops`, naming what is missing, with the
    content hint; exit 1; the text report lists them."""
    predicate, missing = DROPPING[name]
    report = audit_template(load_renderer(TEMPLATES / f"{name}.jinja"))
    dropped = {r.case.case_id for r in report.results if r.verdict == "drops"}
    assert dropped == _expected(predicate)
    assert report.counts()["fail"] == 0 and not report.passed
    for result in report.results:
        if result.verdict == "drops":
            assert result.missing == missing and result.prefix_verdict == "pass"
            assert result.hint is not None and result.hint.code == "content_dropped"
        else:
            assert result.verdict == "pass", result.case.case_id
    code, out, _ = run_cli(
        ["audit-template", TEMPLATES / f"{name}.jinja", "--color", "never"], capsys
    )
    assert code == 1 and "DROPS" in out and f"render without the {', '.join(missing)}" in out


def test_string_content_rendered_as_empty_shells_uses_content_blocks() -> None:
    """A template that reads content only as blocks renders string content as empty turns (like
    Idefics3): the audit uses the content-blocks spelling, where everything shows, and passes."""
    report = audit_template(load_renderer(TEMPLATES / "content_blocks_only.jinja"))
    assert report.passed and report.counts()["pass"] == len(all_cases())
    assert all(r.dialect_used is not None and r.dialect_used.content_blocks for r in report.results)


def test_template_without_reasoning_support_has_no_reasoning_cases() -> None:
    """A template that never renders `reasoning_content` does not fail or drop on reasoning cases:
    they are not applicable, with the reason; every other case is judged as usual."""
    report = audit_template(load_renderer(TEMPLATES / "no_reasoning.jinja"))
    assert report.passed and not report.renders_reasoning
    for result in report.results:
        if result.case.reasoning:
            assert result.verdict == "unsupported" and "never renders reasoning" in (
                result.error or ""
            )
        else:
            assert result.verdict == "pass"


@pytest.mark.parametrize(
    "source",
    [
        TEMPLATES / "renders_nothing.jinja",
        Path(__file__).resolve().parents[2] / "tito_agents" / "cli" / "_errors.py",
        Path(__file__).resolve().parents[2] / "README.md",
    ],
    ids=["empty_shells", "python_file", "readme"],
)
def test_a_template_that_renders_no_conversation_is_bad_input(
    source: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A template whose output holds none of the conversation, and any file that is not a chat
    template, is exit 2 with one clear line, never a pass."""
    code, out, err = run_cli(["audit-template", source], capsys)
    assert code == 2 and out == ""
    assert "renders no conversation" in err and str(source) in err


def test_a_tokenizer_config_given_as_template_says_give_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tokenizer_config.json given as the template is named as such (its text would render as a
    template of its own); any other JSON file is named as JSON."""
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": "{{ messages }}", "eos_token": "</s>"}))
    code, _, err = run_cli(["audit-template", config], capsys)
    assert code == 2 and "is a tokenizer config" in err and "give its folder instead" in err
    other = tmp_path / "data.json"
    other.write_text(json.dumps({"messages": []}))
    code, _, err = run_cli(["audit-template", other], capsys)
    assert code == 2 and "is a JSON file, not a chat template" in err


def test_tokenizer_without_the_templates_tokens_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Llama 3.1's template audited with SmolLM2's tokenizer: its header markers are not tokens of
    that tokenizer, so the report lists them and warns that token-level failures may not be real.
    The project's own template with SmolLM2's tokenizer gets no warning."""
    paths = {p.stem: p for p in TRL}
    _, out, _ = run_cli(
        ["audit-template", paths["llama3_1"], "--tokenizer", tokenizer_dir(), "--json"], capsys
    )
    data = json.loads(out)
    assert {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"} <= set(data["missing_tokens"])
    _, text, _ = run_cli(
        ["audit-template", paths["llama3_1"], "--tokenizer", tokenizer_dir(), "--color", "never"],
        capsys,
    )
    assert "warning: the tokenizer splits" in text and "<|start_header_id|>" in text
    assert "may not be real" in text
    _, text, _ = run_cli(
        ["audit-template", TOOLS_TEMPLATE_PATH, "--tokenizer", tokenizer_dir(), "--color", "never"],
        capsys,
    )
    assert "warning" not in text
