"""The template audit against TRL's own checks, on every chat template TRL ships.

TRL (a dev dependency) decides two things about a template: `supports_tool_calling` (a tool call and
its result survive rendering) and `is_chat_template_prefix_preserving` (appending a tool result to
an assistant tool-call turn extends the rendering, token for token). The audit's case
`tool_calls:+tool` checks the same conversation shape, so per template:

* TRL's tool calling == the case neither drops content nor is refused;
* TRL's prefix preservation == the case's prefix comparison passes (TRL raising == refused).

Both are decided with the same tokenizer (SmolLM2's, the template set as its chat template). Every
disagreement must be one of the documented ones below, and each is proven, not just listed:

* `content_moved` (Gemma 4 family, diffusion Gemma): TRL's tool-call turn has empty content; the
  audit's has text too, and these templates move that text behind the tool result once one
  follows, so the history re-renders. With TRL's spelling (no text beside the call, no system
  message) the audit's own comparison passes, as TRL says.
* `content_blocks` (Idefics3, SmolVLM): TRL, given a tokenizer rather than the model's processor,
  sends string content, which these templates cannot render (it raises). The audit finds that
  string content renders no text and uses content blocks, which render (then reports that the
  tool call itself is dropped, as TRL's `supports_tool_calling` does).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_samples import trl_templates
from tito_agents.cli._templates import load_renderer
from tito_agents.cli.audit.cases import USER_TEXT, AuditCase, Dialect, conversation, head
from tito_agents.cli.audit.command import CaseResult, audit_template
from tito_agents.testing.smollm2 import load_tokenizer, tokenizer_dir
from tito_agents.token_codec import RenderRefused, TemplateRenderer

TRL = trl_templates()
TOOL_RESULT_CASE = AuditCase(
    "append", tool_calls=True, reasoning=False, tools=False, appended="tool"
)
TRL_SPELLING = Dialect(system=False, tool_call_content=False)
"""How TRL's checks spell the conversation: no system message, no text beside the tool call."""

EXPLAINED: dict[str, str] = {
    **dict.fromkeys(
        (
            "diffusion_gemma",
            "diffusion_gemma_training",
            "gemma4",
            "gemma4_v3",
            "gemma4_v4",
            "gemma4_v5",
        ),
        "content_moved",
    ),
    **dict.fromkeys(
        ("idefics3", "idefics3_training", "smolvlm", "smolvlm_training"), "content_blocks"
    ),
}
"""Template -> why the audit and TRL disagree on it (see the module docstring)."""


def _trl_verdicts(template: str) -> tuple[bool | str, bool]:
    """(TRL's prefix preservation, or "refuses" when it raises; TRL's tool calling)."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    tokenizer = copy.copy(load_tokenizer())
    tokenizer.chat_template = template
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prefix: bool | str = bool(is_chat_template_prefix_preserving(tokenizer))
        except Exception:  # TemplateError / UndefinedError: the template refuses the conversation
            prefix = "refuses"
        tools = bool(supports_tool_calling(tokenizer))
    return prefix, tools


def _our_verdicts(result: CaseResult) -> tuple[bool | str, bool]:
    if result.verdict == "unsupported":
        return "refuses", False
    prefix = result.prefix_verdict if result.verdict == "drops" else result.verdict
    return prefix == "pass", result.verdict != "drops"


def _prefix_preserved(renderer: TemplateRenderer, case: AuditCase, dialect: Dialect) -> bool:
    """The case's own comparison (text, then ids) in one spelling."""
    earlier_messages, later_messages = conversation(case, dialect)
    earlier = renderer.render(earlier_messages, tools=None, add_generation_prompt=False)
    later = renderer.render(later_messages, tools=None, add_generation_prompt=True)
    if not later.startswith(earlier):
        return False
    earlier_ids = renderer.encode(earlier).tolist()
    return bool(renderer.encode(later).tolist()[: len(earlier_ids)] == earlier_ids)


def _prove(reason: str, renderer: TemplateRenderer, result: CaseResult, trl: Any) -> None:
    if reason == "content_moved":
        assert result.verdict == "fail" and result.hint is not None
        assert result.hint.code == "content_moved"
        assert trl[0] is True and _prefix_preserved(renderer, TOOL_RESULT_CASE, TRL_SPELLING)
        return
    assert reason == "content_blocks"
    assert trl[0] == "refuses"
    assert result.dialect_used is not None and result.dialect_used.content_blocks
    try:
        plain = renderer.render(head(TRL_SPELLING), tools=None, add_generation_prompt=True)
    except RenderRefused:
        return
    assert USER_TEXT not in plain  # string content renders as an empty shell


@pytest.mark.parametrize("path", TRL, ids=[p.stem for p in TRL])
def test_audit_agrees_with_trl_or_the_disagreement_is_explained(path: Path) -> None:
    """On each TRL template the audit's `tool_calls:+tool` verdict matches TRL's two checks, or the
    template is a documented disagreement whose reason holds."""
    renderer = load_renderer(path, tokenizer=tokenizer_dir())
    (result,) = audit_template(renderer, [TOOL_RESULT_CASE]).results
    trl = _trl_verdicts(path.read_text(encoding="utf-8"))
    ours = _our_verdicts(result)
    reason = EXPLAINED.get(path.stem)
    if reason is None:
        assert ours == trl, (path.stem, result.verdict, result.hint)
    else:
        assert ours != trl, f"{path.stem} now agrees with TRL: drop it from EXPLAINED"
        _prove(reason, renderer, result, trl)


def test_the_cross_check_covers_every_shipped_template() -> None:
    """TRL ships dozens of templates; each explained disagreement names one of them."""
    names = {p.stem for p in TRL}
    assert len(names) >= 70
    assert set(EXPLAINED) <= names


def test_templates_that_drop_the_tool_exchange_do_not_pass() -> None:
    """Templates that drop the tool call or its result (Llama 3, LFM2, Qwen2.5-VL, Cohere2, Phi-3)
    get `drops` on the tool-result case, with what is missing, as TRL's `supports_tool_calling`
    says."""
    paths = {p.stem: p for p in TRL}
    expected = {
        "llama3": ["tool call name", "tool call arguments"],
        "lfm2": ["tool call name", "tool call arguments"],
        "qwen2_5_vl": ["tool call name", "tool call arguments"],
        "cohere2": ["tool call name", "tool call arguments", "tool result"],
        "phi3": ["tool call name", "tool call arguments", "tool result"],
    }
    for name, missing in expected.items():
        report = audit_template(load_renderer(paths[name]), [TOOL_RESULT_CASE])
        assert not report.passed, name
        (result,) = report.results
        assert result.verdict == "drops" and result.missing == missing, name
        assert result.hint is not None and result.hint.code == "content_dropped"
