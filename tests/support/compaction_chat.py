"""A plain-client chat loop that compacts its history, for the fake and the real vLLM: six turns,
a summariser call every two, its summary quoted inside a message of the next prompt ("Summary so
far: ..."), where the engine re-tokenizes it: the sampled ids of the summary are not in the prompt
verbatim."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import openai

import tito_agents as tito

TOPICS = ("fruit", "colour", "animal", "city", "river", "mountain")
"""One question per turn ("Name one fruit."): six turns, two summaries, eight calls."""
SYSTEM = "Answer in one short sentence."
SUMMARISE = "Summarise this conversation."
"""The summariser's system prompt (a fake responder tells the summary call by it)."""


def recap(summary: str, where: str) -> list[dict[str, Any]]:
    """The history that replaces the old one: the summary inside a message (`where`: "assistant",
    "user" or "system"), with words around it."""
    system = {"role": "system", "content": SYSTEM}
    if where == "system":
        return [{"role": "system", "content": f"{SYSTEM}\n\nSummary so far: {summary}"}]
    if where == "user":
        content = f"Summary so far: {summary}\n\nGo on from there."
        return [system, {"role": "user", "content": content}]
    return [system, {"role": "assistant", "content": f"Summary so far: {summary}"}]


def run_chat(
    client: openai.OpenAI,
    model: str,
    role: str | None,
    where: str = "assistant",
    max_tokens: int = 64,
) -> tuple[list[str], int]:
    """The loop, in the caller's episode and agent: summarises in a call labelled `role` (none
    when None); returns the response ids of its calls and how many summaries it made."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    sent: list[str] = []
    summaries = 0
    for turn, topic in enumerate(TOPICS):
        if turn and turn % 2 == 0:
            transcript = "\n".join(str(m["content"]) for m in messages[1:])
            with tito.labels(role=role) if role else nullcontext():
                done = client.chat.completions.create(
                    model=model,
                    messages=[
                        {"role": "system", "content": SUMMARISE},
                        {"role": "user", "content": transcript},
                    ],
                    max_tokens=max_tokens,
                )
            sent.append(done.id)
            summaries += 1
            messages = recap(str(done.choices[0].message.content), where)
        messages.append({"role": "user", "content": f"Name one {topic}."})
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens
        )
        sent.append(reply.id)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return sent, summaries
