"""Rendering chat templates the way transformers (and so vLLM) does, with or without a tokenizer.

With a tokenizer, `tokenizer.apply_chat_template(..., tokenize=False)` renders (the tokenizer's special
tokens are template variables, exactly as in vLLM's chat endpoint), also for a bare template given
with `--tokenizer` (as vLLM renders `--chat-template FILE`). A bare template without a tokenizer is
rendered with transformers' own sandboxed Jinja environment (`render_jinja_template`), with
placeholder special tokens. Text becomes ids with `add_special_tokens=False`, as vLLM encodes a
rendered chat prompt.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito_agents.calls import IdArray
from tito_agents.cli._errors import CliInputError
from tito_agents.cli._tokenizers import encode_text, is_gguf, load_tokenizer

__all__ = [
    "PLACEHOLDER_SPECIAL_TOKENS",
    "RenderRefused",
    "TemplateRenderer",
    "check_compiles",
    "load_renderer",
]

PLACEHOLDER_SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
}
"""Template variables given to a bare template (no tokenizer): templates read `bos_token` etc."""

Message = dict[str, Any]


class RenderRefused(Exception):
    """The template raised while rendering one conversation (a `raise_exception` refusal or a bug)."""


@dataclass(slots=True)
class TemplateRenderer:
    """A chat template and what renders and tokenizes it.

    `tokenizer` renders (when it came with the template) and tokenizes (when given at all);
    `origin` names where the template came from, for reports.
    """

    origin: str
    template: str
    tokenizer: Any | None = None
    tokenizer_origin: str | None = None
    renders_with_tokenizer: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def template_sha256(self) -> str:
        return hashlib.sha256(self.template.encode()).hexdigest()

    @property
    def token_level(self) -> bool:
        return self.tokenizer is not None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        """The prompt text of `messages`; `RenderRefused` when the template raises."""
        try:
            if self.renders_with_tokenizer and self.tokenizer is not None:
                text = self.tokenizer.apply_chat_template(
                    [dict(m) for m in messages],
                    tools=None if tools is None else [dict(t) for t in tools],
                    chat_template=self.template,
                    add_generation_prompt=add_generation_prompt,
                    tokenize=False,
                    **self.template_kwargs,
                )
            else:
                text = _render_bare(
                    self.template, messages, tools, add_generation_prompt, self.template_kwargs
                )
        except Exception as exc:  # jinja2 errors, template bugs (TypeError, ...): all refusals
            raise RenderRefused(_short(exc)) from exc
        if not isinstance(text, str):
            raise RenderRefused(f"rendering returned {type(text).__name__}, not text")
        return text

    def encode(self, text: str) -> IdArray:
        if self.tokenizer is None:
            raise ValueError("no tokenizer: text level only")
        return encode_text(self.tokenizer, text)


def load_renderer(
    source: str | Path,
    *,
    tokenizer: str | Path | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> TemplateRenderer:
    """The template of a tokenizer folder, a GGUF file or a bare Jinja file, checked to compile.

    `tokenizer` (a folder or GGUF file) tokenizes for the token-level audit; a folder or GGUF
    `source` is its own tokenizer unless one is given.
    """
    path = Path(source).expanduser()
    if not path.exists():
        raise CliInputError(path, "no such file or folder")
    kwargs = dict(template_kwargs or {})
    if path.is_dir() or is_gguf(path):
        own = load_tokenizer(path)
        template = _tokenizer_template(path, own)
        renderer = TemplateRenderer(str(path), template, own, str(path), True, kwargs)
    else:
        try:
            template = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliInputError(path, f"cannot read template: {_short(exc)}") from exc
        _refuse_json_config(path, template)
        renderer = TemplateRenderer(str(path), template, None, None, False, kwargs)
    if tokenizer is not None:
        # Rendered with the tokenizer, as vLLM renders `--chat-template FILE`: its special tokens
        # (bos_token, eos_token) are the template's variables, not placeholders.
        renderer.tokenizer = load_tokenizer(tokenizer)
        renderer.tokenizer_origin = str(tokenizer)
        renderer.renders_with_tokenizer = True
    check_compiles(path, renderer.template)
    return renderer


def _refuse_json_config(path: Path, text: str) -> None:
    """A JSON file is not a template (a Jinja compiler would happily render it as text): name a
    tokenizer config as such."""
    if not text.lstrip().startswith("{"):
        return
    try:
        value = json.loads(text)
    except ValueError:
        return  # a template that starts with `{%` or `{{`
    if isinstance(value, dict) and "chat_template" in value:
        raise CliInputError(
            path, "is a tokenizer config, not a chat template: give its folder instead"
        )
    raise CliInputError(path, "is a JSON file, not a chat template")


def _tokenizer_template(path: Path, tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):  # named templates: the default one, else the first
        template = template.get("default") or next(iter(template.values()), None)
    if not isinstance(template, str) or not template.strip():
        raise CliInputError(path, "the tokenizer has no chat template")
    return template


def check_compiles(path: Path, template: str) -> None:
    """`CliInputError` naming `path` when the template is empty or does not compile."""
    if not template.strip():
        raise CliInputError(path, "the template is empty")
    try:
        compile_template = _compiler()
        compile_template(template)
    except ImportError as exc:
        raise CliInputError(
            path,
            "auditing a template needs transformers and jinja2: pip install transformers "
            "jinja2 (or, in a tito-agents checkout: pip install '.[tokenizer]')",
        ) from exc
    except Exception as exc:  # jinja2.TemplateSyntaxError and friends
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise CliInputError(path, f"template does not compile{where}: {_short(exc)}") from exc


def _compiler() -> Any:
    from transformers.utils import chat_template_utils

    return chat_template_utils._compile_jinja_template


def _render_bare(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    template_kwargs: Mapping[str, Any],
) -> str:
    from transformers.utils import chat_template_utils

    variables = {**PLACEHOLDER_SPECIAL_TOKENS, **template_kwargs}
    render = getattr(chat_template_utils, "render_jinja_template", None)
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    tool_list = None if tools is None else [dict(t) for t in tools]
    if render is not None:
        rendered, _ = render(
            conversations=[chat],
            tools=tool_list,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
        text: str = rendered[0]
        return text
    compiled = chat_template_utils._compile_jinja_template(template)  # transformers < 4.50
    text = compiled.render(
        messages=chat, tools=tool_list, add_generation_prompt=add_generation_prompt, **variables
    )
    return text


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
