"""Checks of a command's inputs that more than one command makes: ids beyond the tokenizer's
vocabulary (`show`, `drift`), and a template that renders a basic chat with the user's text in it
(`audit-template`, `drift --chat-template`). Each refusal is a `CliInputError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tito_agents.cli._errors import CliInputError
from tito_agents.cli.audit.cases import REASONING_TEXT, USER_TEXT, AuditCase, conversation, dialects
from tito_agents.samples import Sample
from tito_agents.token_codec import RenderRefused, TemplateRenderer

__all__ = ["TemplateProbe", "check_chat_template", "check_vocabulary", "probe_template"]


def check_vocabulary(samples: Iterable[Sample], vocabulary: int) -> None:
    """Refuse ids the tokenizer does not know (it would decode them to nothing): wrong tokenizer."""
    for sample in samples:
        if sample.num_tokens and int(sample.token_ids.max()) >= vocabulary:
            raise CliInputError(
                None,
                f"sample {sample.sample_id} holds id {int(sample.token_ids.max())}, beyond the "
                f"tokenizer's {vocabulary:,} ids: is --tokenizer the model's tokenizer?",
            )


def check_chat_template(renderer: TemplateRenderer) -> None:
    """`CliInputError` unless the renderer's template renders a basic chat with the user's text
    in it: a file that is not a chat template (an HTML page, a README) compiles as Jinja, so
    compiling proves nothing."""
    probe_template(renderer)


@dataclass(frozen=True, slots=True)
class TemplateProbe:
    """What the template does with a basic chat, found once before the cases run."""

    renders_reasoning: bool
    """Whether any dialect renders `reasoning_content` of a final assistant turn at all."""


def probe_template(renderer: TemplateRenderer) -> TemplateProbe:
    """Render a user question and a plain answer (with and without reasoning) in each dialect.

    `CliInputError` when no dialect renders it (the template cannot render a basic chat), or when
    some do but none shows the user's text (the template renders no conversation).
    """
    rendered_any = shows_conversation = reasoning = False
    first_error: str | None = None
    for with_reasoning in (False, True):
        case = AuditCase("generation", tool_calls=False, reasoning=with_reasoning, tools=False)
        for dialect in dialects():
            _, messages = conversation(case, dialect)
            try:
                text = renderer.render(messages, tools=None, add_generation_prompt=False)
            except RenderRefused as exc:
                first_error = first_error or str(exc)
                continue
            rendered_any = True
            shows_conversation = shows_conversation or USER_TEXT in text
            reasoning = reasoning or (with_reasoning and REASONING_TEXT in text)
    if not rendered_any:
        raise CliInputError(renderer.origin, f"template fails to render: {first_error}")
    if not shows_conversation:
        raise CliInputError(renderer.origin, _no_conversation(renderer))
    return TemplateProbe(reasoning)


def _no_conversation(renderer: TemplateRenderer) -> str:
    text = renderer.template.lstrip()
    what = "renders no conversation: the messages' text is not in its output"
    if text.startswith("{") and '"chat_template"' in text:
        return f"{what} (a tokenizer config? give its folder instead)"
    if "messages" not in renderer.template:
        return f"{what} (it never reads `messages`: is this a chat template?)"
    return f"{what} (is this a chat template?)"
