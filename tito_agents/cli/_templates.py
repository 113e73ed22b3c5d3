"""Chat templates given on the command line: a tokenizer folder, a GGUF file or a bare Jinja file,
loaded as a `tito_agents.token_codec.TemplateRenderer` and checked to compile, with one-line errors
naming the file (a JSON config, an empty template, a syntax error with its line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tito_agents.cli._errors import CliInputError
from tito_agents.cli._tokenizers import is_gguf, load_tokenizer
from tito_agents.token_codec import TemplateRenderer

__all__ = ["check_compiles", "load_renderer"]


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


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
