"""Captured calls on LangChain messages: put the call id (and optionally the token ids) into an
`AIMessage`'s `response_metadata["tito"]`, and read them back, so agents that keep messages in their
state (and checkpoints) keep the join key to the exact sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.messages import BaseMessage

from tito_agents import Call, CallStatus, Episode

METADATA_KEY = "tito"
"""The `response_metadata` key holding `{"episode_id", "call_id"[, "prompt_token_ids", "token_ids"]}`."""


def calls_of_run(episode: Episode, run_id: UUID, response_id: str | None) -> list[Call]:
    """The calls (any status) a chat model run made, by choice index: found by the response id
    when LangChain kept it (not streamed), else by the run id the marker put on their labels."""
    run_label = str(run_id)
    by_response: list[Call] = []
    by_run: list[Call] = []
    for call in reversed(list(episode.calls)):  # a run's calls are among the most recent ones
        if response_id is not None and call.request_id == response_id:
            by_response.append(call)
        elif call.labels.get("lc_run_id") == run_label:
            by_run.append(call)
    found = by_response or _last_response(by_run)
    return sorted(found, key=lambda c: c.choice_index)


def _last_response(calls: list[Call]) -> list[Call]:
    """The choices of the latest response among `calls` (given newest first)."""
    if not calls:
        return []
    latest = calls[0].request_id
    return [c for c in calls if c.request_id == latest]


def response_id_of(response: Any) -> str | None:
    """The chat completion id langchain-openai kept for a non-streamed response (None when
    streamed: LangChain drops it there)."""
    llm_output = getattr(response, "llm_output", None) or {}
    found = llm_output.get("id")
    if isinstance(found, str):
        return found
    for generations in getattr(response, "generations", ()):
        for generation in generations:
            message = getattr(generation, "message", None)
            value = getattr(message, "response_metadata", {}).get("id")
            if isinstance(value, str):
                return value
    return None


def attach(
    generations: Sequence[Any], calls: Sequence[Call], episode: Episode, *, token_ids: bool
) -> None:
    """Write each complete call's ids into the `response_metadata` of its choice's message."""
    by_index = {c.choice_index: c for c in calls if c.status is CallStatus.COMPLETE}
    for index, generation in enumerate(generations):
        message = getattr(generation, "message", None)
        call = by_index.get(index)
        if call is None or not isinstance(message, BaseMessage):
            continue
        entry: dict[str, Any] = {"episode_id": episode.episode_id, "call_id": call.call_id}
        if token_ids:
            entry["prompt_token_ids"] = call.prompt_ids.tolist()
            entry["token_ids"] = call.sampled_ids.tolist()
        message.response_metadata[METADATA_KEY] = entry


def tito_metadata(message: Any) -> Mapping[str, Any] | None:
    """The `response_metadata["tito"]` entry of a message (or a message dict), if any."""
    if isinstance(message, BaseMessage):
        entry = message.response_metadata.get(METADATA_KEY)
    elif isinstance(message, Mapping):
        entry = (message.get("response_metadata") or {}).get(METADATA_KEY)
    else:
        return None
    return entry if isinstance(entry, Mapping) else None


def call_id_of(message: Any) -> str | None:
    """The id of the captured call that produced `message` (an `AIMessage` a wrapped model
    returned under `TitoCallbackHandler`), or None."""
    entry = tito_metadata(message)
    value = entry.get("call_id") if entry is not None else None
    return value if isinstance(value, str) else None


def episode_ids_in(result: Any) -> list[str]:
    """The episode ids found on the messages of a graph result, a message list or a message."""
    if isinstance(result, Mapping) and "messages" in result:
        result = result["messages"]
    messages: Iterable[Any] = (
        result if isinstance(result, Sequence) and not isinstance(result, str) else [result]
    )
    found: list[str] = []
    for message in messages:
        entry = tito_metadata(message)
        value = entry.get("episode_id") if entry is not None else None
        if isinstance(value, str) and value not in found:
            found.append(value)
    return found
