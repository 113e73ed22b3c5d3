"""Two server-side choices of vLLM's Messages conversion, found out the way capture can ask.

`to_chat_completion_request` depends on two facts vLLM works out from its chat template, which a
client cannot read (`messages.convert` takes them as arguments):

* `merge_inline_system` (`_should_merge_inline_system`, decided at start-up): whether `role:
  system` messages inside `messages` (Claude Code's per-turn reminders) are merged into the leading
  system message, because the template rejects a system message after the first. Capture asks the
  server itself: `/v1/messages/count_tokens` of `MERGE_PROBE` against `/tokenize` of its two
  possible conversions (`merge_probe`). The probe texts join without changing their tokens, so the
  two conversions differ by one message's framing and the count tells them apart
  (`merge_from_counts`; None when it cannot: then requests with inline system messages are left
  to `/v1/messages`).
* `disabled_thinking_effort` (`_probe_disabled_thinking_effort`, decided on the first request
  with `thinking: {"type": "disabled"}`): `none` when the template renders `reasoning_effort:
  none` differently from every effort, else `low`. Capture renders the same probe through
  `/tokenize` (`effort_probes`, the kwargs `build_chat_params` passes) and decides as vLLM does
  (`disabled_effort_from`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tito_agents._capture.messages.convert import EFFORTS, chat_request

__all__ = [
    "MERGE_PROBE",
    "PROBES",
    "disabled_effort_from",
    "effort_probes",
    "merge_from_counts",
    "merge_probe",
    "probes_needed",
]

MERGE_PROBE: dict[str, Any] = {
    "system": "Hello.",
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": " World."},
        {"role": "user", "content": "Go"},
    ],
}
"""A Messages request with an inline system message (model added by `merge_probe`)."""


PROBES = ("merge_inline_system", "disabled_thinking_effort")
"""The probed choices, named as `chat_request`'s keyword arguments."""


def probes_needed(payload: Mapping[str, Any]) -> list[str]:
    """The probed choices the conversion of `payload` depends on: `merge_inline_system` when a
    message has role system, `disabled_thinking_effort` with `thinking: {"type": "disabled"}`.
    Most requests need neither (then no probe runs)."""
    needed = []
    messages = payload.get("messages")
    if type(messages) is list and any(
        type(m) is dict and m.get("role") == "system" for m in messages
    ):
        needed.append(PROBES[0])
    thinking = payload.get("thinking")
    if type(thinking) is dict and thinking.get("type") == "disabled":
        needed.append(PROBES[1])
    return needed


def merge_probe(model: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The `/v1/messages/count_tokens` body, and the `/tokenize` bodies of its conversion with
    and without merging."""
    count = {"model": model, **MERGE_PROBE}
    tokenize = []
    for merge in (True, False):
        chat = chat_request({**count, "max_tokens": 1}, merge_inline_system=merge)
        assert isinstance(chat, dict)
        tokenize.append({"model": model, "messages": chat["messages"]})
    return count, tokenize[0], tokenize[1]


def merge_from_counts(input_tokens: int, merged: int | None, unmerged: int | None) -> bool | None:
    """vLLM's `merge_inline_system` from the probe's `input_tokens` and the token counts of the
    two conversions (None where `/tokenize` refused one); None when the counts do not decide."""
    fits = [merge for merge, count in ((True, merged), (False, unmerged)) if count == input_tokens]
    return fits[0] if len(fits) == 1 else None


def effort_probes(model: str) -> dict[str, dict[str, Any]]:
    """The `/tokenize` bodies vLLM's effort probe renders, by effort (`none` first)."""
    return {
        effort: {
            "model": model,
            "messages": [{"role": "user", "content": "Hi"}],
            "chat_template_kwargs": {
                "reasoning_effort": effort,
                "enable_thinking": effort != "none",
            },
        }
        for effort in ("none", *EFFORTS)
    }


def disabled_effort_from(renders: Mapping[str, Sequence[int] | None]) -> str:
    """`_probe_disabled_thinking_effort`: `low` when `none` failed to render (None) or renders
    as some effort does, else `none`."""
    none = renders.get("none")
    if none is None:
        return "low"
    return "low" if any(renders.get(effort) == none for effort in EFFORTS) else "none"
