"""Fix hints for known ways chat templates break prefix preservation.

Each detector looks at one failed case (the two renderings and where they diverge) and returns a
`Hint` when its pattern applies; the first match wins. The hints say what merged samples will do
(split, with which divergence kind) and what to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tito_agents.cli.audit.cases import (
    APPENDED_TEXT,
    ASSISTANT_TEXT,
    FINAL_TEXT,
    REASONING_TEXT,
    TOOL_NAME,
    USER_TEXT,
    AuditCase,
)

__all__ = ["Hint", "Mismatch", "content_hint", "find_hint", "marker_start"]

_TAIL_CHARS = 48
_REASONING_OPEN = re.compile(
    r"\s*(<(think|thinking|reasoning|thought)>|<\|channel\|?>\s*(thought|analysis)|<\|thinking\|>)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A failed case: the earlier and later renderings and the first differing character."""

    case: AuditCase
    earlier: str
    later: str
    char_position: int
    token_level: bool
    """True when the texts extend but the ids do not (a tokenization boundary problem)."""
    earlier_token: str = ""
    later_token: str = ""


@dataclass(frozen=True, slots=True)
class Hint:
    code: str
    text: str


def find_hint(m: Mismatch) -> Hint | None:
    """The first known pattern that explains the mismatch, or None."""
    for detector in _DETECTORS:
        hint = detector(m)
        if hint is not None:
            return hint
    return None


def content_hint(case: AuditCase, missing: list[str]) -> Hint:
    """What a template that leaves content out of its rendering does to samples, and the fix."""
    what = ", ".join(missing)
    if any(label.startswith("tool") for label in missing):
        effect = (
            "the model's prompts never show the tool exchange it trained on (a trainer sees a "
            "history without the calls or results the agent really had)"
        )
        fix = (
            "use a template that renders `tool_calls` and `tool` messages (trl's `supports_tool_"
            "calling` checks the same), e.g. the model's tool-use template or a *_training.jinja"
        )
    elif "system text" in missing:
        effect = (
            "a system message sent mid-conversation is left out (the template renders a system "
            "message only at the start), so the prompt is not the conversation the agent sent"
        )
        fix = "do not send system messages mid-conversation, or render them in place"
    elif "reasoning" in missing:
        effect = "the reasoning the model sampled is not in the history it is shown next"
        fix = "render `reasoning_content` (or strip reasoning from the messages your agent sends)"
    else:
        effect = "the rendered prompt is not the conversation the agent sent"
        fix = (
            "check the message spelling the template expects (content as text or as blocks); a "
            "template that renders only one spelling drops the other silently"
        )
    return Hint(
        "content_dropped",
        f"the rendering leaves out the {what} of this conversation in every message spelling "
        f"tried: {effect}. Fix: {fix}.",
    )


def _token_boundary(m: Mismatch) -> Hint | None:
    if not m.token_level:
        return None
    return Hint(
        "token_boundary",
        f"the text extends but the ids do not: the earlier rendering's last token {m.earlier_token!r} "
        f"and the appended text re-tokenize as {m.later_token!r}. Merged samples split there "
        "(kind retokenized). Fix: end each turn with a special token, or a separator that stays its "
        "own token whatever follows.",
    )


def _reasoning_dropped(m: Mismatch) -> Hint | None:
    split = marker_start(m.earlier, m.char_position)
    opens_block = _REASONING_OPEN.match(m.earlier, split) is not None
    if m.case.check == "generation":
        if not (opens_block or _REASONING_OPEN.search(m.earlier[-32:])):
            return None
        return Hint(
            "reasoning_in_generation_prompt",
            f"the generation prompt writes {m.earlier[max(0, split - 16) :]!r} but the assistant turn "
            f"renders {m.later[max(0, split - 16) : split + 24]!r}: the prompt opens (or closes) a "
            "reasoning block the re-rendered turn spells differently, so the sampled reasoning never "
            "matches the history. Merged samples split (kind template_rerender). Fix: render "
            "`reasoning_content` inside the same block the generation prompt opens (a "
            "training-patched template), or use the template's no-reasoning mode consistently.",
        )
    in_earlier = REASONING_TEXT in m.earlier[m.char_position :]
    in_later = REASONING_TEXT in m.later
    if m.case.reasoning and in_earlier and not in_later:
        return Hint(
            "reasoning_dropped",
            "the template renders reasoning only on the last assistant turn and drops it from earlier "
            "turns once another message follows (Qwen3 / DeepSeek-R1 style). Merged samples split "
            "after every reasoning turn (kind template_rerender). Fix: keep reasoning on every turn "
            "(a training-patched template such as trl's *_training.jinja, or drop the "
            "`loop.index0 > last_query_index` condition), or strip reasoning from the assistant "
            "messages your agent sends back and from the training samples alike.",
        )
    deleted = _deleted_text(m, split)
    if deleted is not None and _REASONING_OPEN.search(deleted):
        shown = deleted if len(deleted) <= 60 else deleted[:57] + "..."
        return Hint(
            "reasoning_block_dropped",
            f"the template writes a reasoning block ({shown!r}) into the last assistant turn although "
            "no reasoning was given and drops it once another message follows. The model samples "
            "that block, so merged samples split after every turn (kind "
            "template_rerender). Fix: render the block the same way on every turn (a "
            "training-patched template such as trl's *_training.jinja does).",
        )
    if m.case.reasoning and not in_earlier and REASONING_TEXT in m.later[m.char_position :]:
        return Hint(
            "reasoning_added",
            "the later rendering shows reasoning the earlier one did not: the template decides "
            "whether to render reasoning from messages that come after it. Fix: render "
            "`reasoning_content` the same way whatever follows.",
        )
    return None


def _generation_prompt(m: Mismatch) -> Hint | None:
    if m.case.check != "generation":
        return None
    return Hint(
        "generation_prompt_mismatch",
        f"the generation prompt ends with {_tail(m.earlier, m.char_position)!r} but the template "
        f"opens the assistant turn with {_head(m.later, m.char_position)!r}: the ids the model "
        "samples after the prompt will not match the re-rendered history. Fix: make "
        "`add_generation_prompt` emit exactly the assistant header the message loop writes.",
    )


def _system_hoisted(m: Mismatch) -> Hint | None:
    if m.case.appended != "system":
        return None
    moved_up = APPENDED_TEXT["system"] in m.later[: m.char_position + 1]
    if not (moved_up or _before_user_end(m)):
        return None
    return Hint(
        "system_hoisted",
        "a system message sent mid-conversation is moved into (or changes) the opening system "
        "block, so the whole history re-renders. Merged samples split there (kind "
        "history_rewrite). Fix: render later system messages in place, or do not send them.",
    )


def _earlier_turn_rewritten(m: Mismatch) -> Hint | None:
    if not _before_user_end(m):
        return None
    where = (
        "the tools block"
        if m.case.tools and TOOL_NAME in m.earlier[: m.char_position + 200]
        else "an earlier message"
    )
    return Hint(
        "earlier_turn_rewritten",
        f"appending a {m.case.appended} message changes how {where} renders (the template looks "
        "ahead: a last-user index, tools placed beside the last user message, a system prompt built "
        "from all messages). Merged samples split (kind history_rewrite). Fix: render each message "
        "independently of the ones after it.",
    )


def _final_turn_terminator(m: Mismatch) -> Hint | None:
    start = marker_start(m.earlier, m.char_position)
    tail = m.earlier[start:]
    if len(tail) > _TAIL_CHARS or any(
        s in tail for s in (REASONING_TEXT, TOOL_NAME, ASSISTANT_TEXT, FINAL_TEXT)
    ):
        return None
    return Hint(
        "final_turn_terminator",
        f"the template ends a conversation's final message with {tail!r} but writes "
        f"{m.later[start : start + len(tail) + 12]!r} when more follows "
        "(an end-of-text marker or whitespace only on the last turn). Merged samples split there "
        "only when the model samples that marker; if generation stops at an earlier stop token, "
        "the sampled ids never contain it. Fix: write every message's terminator the same whether "
        "or not it is last.",
    )


def _tool_call_rerendered(m: Mismatch) -> Hint | None:
    if not m.case.tool_calls or TOOL_NAME not in m.earlier[m.char_position :]:
        return None
    return Hint(
        "tool_call_rerendered",
        "the assistant's tool call renders differently once more messages follow (e.g. content "
        "or arguments written only on the last turn). Merged samples split (kind "
        "template_rerender). Fix: render tool calls the same way on every turn.",
    )


def _deleted_text(m: Mismatch, split: int) -> str | None:
    """Text the earlier rendering has at `split` that the later one skips (None if not a deletion)."""
    probe = m.later[split : split + 16]
    if len(probe) < 8:
        return None
    resumes = m.earlier.find(probe, split + 1, split + 4096)
    return m.earlier[split:resumes] if resumes > 0 else None


def marker_start(text: str, position: int) -> int:
    """`position`, moved back to the `<` of a `<...>` marker it falls inside (for readable hints)."""
    opening = text.rfind("<", max(0, position - 16), position + 1)
    if opening >= 0 and ">" not in text[opening:position]:
        return opening
    return position


def _text_inserted(m: Mismatch) -> Hint | None:
    """The later rendering has extra text at the point, and then the earlier rendering resumes."""
    p = m.char_position
    probe = m.earlier[p : p + 24]
    if m.case.check != "append" or len(probe) < 8:
        return None
    resumes = m.later.find(probe, p + 1, p + 256)
    if resumes < 0:
        return None
    return Hint(
        "text_inserted",
        f"when a {m.case.appended} message follows, the template writes {m.later[p:resumes]!r} "
        "into the earlier messages at this point (it looks ahead at the next message). Merged "
        "samples split (kind template_rerender). Fix: render each message independently of the "
        "ones after it.",
    )


def _content_moved(m: Mismatch) -> Hint | None:
    for text in (ASSISTANT_TEXT, FINAL_TEXT):
        if m.earlier.startswith(text, m.char_position) and m.later.find(text, m.char_position) > 0:
            return Hint(
                "content_moved",
                "the template moves the assistant's text behind the messages that follow it (e.g. "
                "after the tool results it folds into the same turn), so the history re-renders in "
                "another order. Merged samples split (kind template_rerender). Fix: render each "
                "message in place, in conversation order.",
            )
    return None


def _before_user_end(m: Mismatch) -> bool:
    end_of_user = m.earlier.find(USER_TEXT)
    return end_of_user >= 0 and m.char_position < end_of_user + len(USER_TEXT)


def _tail(text: str, position: int) -> str:
    return text[max(0, position - 24) :]


def _head(text: str, position: int) -> str:
    return text[max(0, position - 8) : position + 24]


_DETECTORS: tuple[Callable[[Mismatch], Hint | None], ...] = (
    _token_boundary,
    _reasoning_dropped,
    _generation_prompt,
    _system_hoisted,
    _earlier_turn_rewritten,
    _content_moved,
    _final_turn_terminator,
    _text_inserted,
    _tool_call_rerendered,
)
