"""Does the audit's tokenizer know the template's special tokens?

Token-level verdicts are only as good as the tokenizer: a template audited with a tokenizer that
lacks its markers (`<|start_header_id|>`, `<｜User｜>`, `[INST]`) sees them split into pieces, and
`token_boundary` failures appear that the model's own tokenizer would not have. The audit collects
the special-token-shaped markers its renderings hold and lists those the tokenizer does not encode as
one token, so the report can warn. Plain tags such as `<think>` or `<tool_call>` are left out: many
tokenizers rightly spell them as text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tito_agents.token_codec import TemplateRenderer

__all__ = ["MARKER", "missing_tokens", "template_markers"]

MARKER = re.compile(
    r"<\|[^\s<>|]{1,48}\|>"  # <|im_start|>, <|eot_id|>
    r"|<｜[^<>｜]{1,48}｜>"  # DeepSeek: <｜User｜>, <｜tool▁calls▁begin｜>
    r"|<\|[^\s<>|]{1,48}>|<[^\s<>|]{1,48}\|>"  # one-sided bars: <|turn>, <turn|>
    r"|\[/?[A-Z][A-Z_]{1,30}\]"  # [INST], [/INST], [TOOL_CALLS]
)
"""Special-token-shaped markers: what a template writes as its model's special tokens."""


def template_markers(renderings: Iterable[str]) -> set[str]:
    """Every special-token-shaped marker in the renderings."""
    found: set[str] = set()
    for text in renderings:
        found.update(MARKER.findall(text))
    return found


def missing_tokens(renderer: TemplateRenderer, renderings: Iterable[str]) -> list[str]:
    """The markers of `renderings` the renderer's tokenizer encodes as more than one token."""
    tokenizer = renderer.tokenizer
    if tokenizer is None:
        return []
    missing = []
    for marker in sorted(template_markers(renderings)):
        if len(renderer.encode(marker)) != 1:
            missing.append(marker)
    return missing
