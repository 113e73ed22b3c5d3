"""vLLM 0.32 response shapes, byte-faithful: one builder per shape, dicts in vLLM's key order.

Rules (see vllm-wire-format.md §3): non-streaming bodies are a full `model_dump()` (every field,
unset ones null); stream chunks are dumped with `exclude_unset`, so which keys exist depends on
what vLLM's code sets; the final usage chunk is dumped with `exclude_none`. JSON is written by
orjson: compact separators, non-ASCII raw, control characters escaped, like pydantic-core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from tito_agents.testing.fake_vllm._logprobs import Scored

__all__ = [
    "DONE",
    "chat_body",
    "chat_chunk",
    "chat_logprobs",
    "chat_message",
    "completion_body",
    "completion_chunk",
    "completion_logprobs",
    "dumps",
    "error_body",
    "models_body",
    "prompt_logprobs_json",
    "sse",
    "usage",
]

DONE = b"data: [DONE]\n\n"

Json = dict[str, Any]


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def sse(event: Any) -> bytes:
    """One SSE event: `data: <json>` and a blank line."""
    return b"data: " + orjson.dumps(event) + b"\n\n"


def sse_named(event: Any) -> bytes:
    """One Responses API SSE event: `event: <type>`, `data: <json>` and a blank line."""
    name = str(event["type"]).encode()
    return b"event: " + name + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def error_body(message: str, err_type: str, param: str | None, code: int) -> bytes:
    return dumps({"error": {"message": message, "type": err_type, "param": param, "code": code}})


def usage(prompt_tokens: int, completion_tokens: int, *, shape: str) -> Json:
    """`usage` in its three shapes: "full" (bodies), "chunk" (continuous, chat), "final" (usage chunk)."""
    body: Json = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if shape == "full":
        body["prompt_tokens_details"] = None
        body["completion_tokens_details"] = None
    elif shape == "chunk":
        body["completion_tokens_details"] = None
    return body


# -- logprobs ------------------------------------------------------------------------------------


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8", "replace"))


def _shown(position: Scored, token_id: int, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else position.texts[token_id]


def chat_logprobs(positions: Sequence[Scored], top_logprobs: int, *, as_ids: bool) -> Json:
    """`choices[i].logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.

    In token-id mode the outer `bytes` stay the decoded text while each top entry's `bytes` are
    the UTF-8 of `"token_id:N"`: vLLM's quirk, kept on purpose.
    """
    content = []
    for position in positions:
        step = position.step
        assert step is not None, "generated positions always have logprobs"
        limit = len(step.ranked) if top_logprobs < 0 else top_logprobs
        top = []
        for token_id, logprob in step.ranked[:limit]:
            token = _shown(position, token_id, as_ids)
            top.append({"token": token, "logprob": logprob, "bytes": _utf8(token)})
        content.append(
            {
                "token": _shown(position, step.token_id, as_ids),
                "logprob": step.logprob,
                "bytes": _utf8(position.texts[step.token_id]),
                "top_logprobs": top,
            }
        )
    return {"content": content}


def completion_logprobs(
    positions: Sequence[Scored], num: int, *, as_ids: bool, text_offset: int = 0
) -> Json:
    """Legacy completions logprobs; a position without a step (first echoed token) has nulls.

    `top_logprobs` maps decoded strings to logprobs (colliding strings overwrite each other) and
    holds up to `num + 1` entries: the actual token and the top `num`.
    """
    offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    tops: list[dict[str, float] | None] = []
    for position in positions:
        token = _shown(position, position.token_id, as_ids)
        offsets.append(text_offset)
        text_offset += len(token)
        tokens.append(token)
        step = position.step
        token_logprobs.append(None if step is None else step.logprob)
        tops.append(
            None
            if step is None
            else {_shown(position, t, as_ids): lp for t, lp in step.ranked[: num + 1]}
        )
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def prompt_logprobs_json(positions: Sequence[Scored]) -> list[Any]:
    """`prompt_logprobs`: null, then `{"<id>": {"logprob", "rank", "decoded_token"}}` per token."""
    result: list[Any] = []
    for position in positions:
        step = position.step
        if step is None:
            result.append(None)
            continue
        result.append(
            {
                str(token_id): {
                    "logprob": logprob,
                    "rank": rank,
                    "decoded_token": position.texts[token_id],
                }
                for (token_id, logprob), rank in zip(step.ranked, step.ranks, strict=True)
            }
        )
    return result


# -- chat ----------------------------------------------------------------------------------------


def chat_message(role: str, content: str | None, tool_calls: Sequence[Json]) -> Json:
    """A non-streaming `message`; 0.32 omits `tool_calls` when there are none."""
    message: Json = {
        "role": role,
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    message["reasoning"] = None
    return message


def chat_choice(
    index: int,
    message: Json,
    logprobs: Json | None,
    finish_reason: str,
    stop_reason: int | str | None,
    token_ids: list[int] | None,
) -> Json:
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": token_ids,
        "routed_experts": None,
    }


def chat_body(
    *,
    response_id: str,
    created: int,
    model: str,
    choices: list[Json],
    fingerprint: str,
    usage_json: Json,
    prompt_logprobs: list[Any] | None,
    prompt_token_ids: list[int] | None,
    prompt_text: str | None,
) -> Json:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage_json,
        "prompt_logprobs": prompt_logprobs,
        "prompt_token_ids": prompt_token_ids,
        "prompt_text": prompt_text,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chat_chunk(
    *,
    response_id: str,
    created: int,
    model: str,
    choice: Json | None,
    usage_json: Json | None = None,
    fingerprint: str | None = None,
    prompt_token_ids: Any = None,
    prompt_text: str | None = None,
    role_chunk: bool = False,
) -> Json:
    """A `chat.completion.chunk`; `choice=None` gives the usage chunk with `choices: []`."""
    chunk: Json = {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [] if choice is None else [choice],
    }
    if usage_json is not None:
        chunk["usage"] = usage_json
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    if role_chunk:
        chunk["prompt_token_ids"] = prompt_token_ids
        chunk["prompt_text"] = prompt_text
    return chunk


def chat_stream_choice(
    index: int,
    delta: Json,
    logprobs: Json | None,
    finish_reason: str | None,
    *,
    token_ids: Any = None,
    has_token_ids: bool = True,
    stop_reason: Any = None,
) -> Json:
    """One streamed choice; `stop_reason` only on the finish chunk, no `token_ids` on role chunks."""
    choice: Json = {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    if has_token_ids:
        choice["token_ids"] = token_ids
    return choice


# -- completions ---------------------------------------------------------------------------------


def completion_body(
    *,
    response_id: str,
    created: int,
    model: str,
    choices: list[Json],
    fingerprint: str,
    usage_json: Json,
) -> Json:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage_json,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def completion_choice(
    index: int,
    text: str,
    logprobs: Json | None,
    finish_reason: str,
    stop_reason: int | str | None,
    token_ids: list[int] | None,
    prompt_logprobs: list[Any] | None,
    prompt_token_ids: list[int] | None,
) -> Json:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": token_ids,
        "prompt_logprobs": prompt_logprobs,
        "prompt_token_ids": prompt_token_ids,
        "routed_experts": None,
    }


def completion_chunk(
    *,
    response_id: str,
    created: int,
    model: str,
    choice: Json | None,
    usage_json: Json | None = None,
    fingerprint: str | None = None,
) -> Json:
    """A streamed `text_completion`; `choice=None` gives the usage chunk."""
    chunk: Json = {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [] if choice is None else [choice],
    }
    if usage_json is not None:
        chunk["usage"] = usage_json
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    return chunk


def completion_stream_choice(
    index: int,
    text: str,
    logprobs: Json | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    prompt_token_ids: list[int] | None,
    token_ids: list[int] | None,
) -> Json:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_token_ids": prompt_token_ids,
        "token_ids": token_ids,
    }


# -- other endpoints -----------------------------------------------------------------------------


def models_body(model: str, max_model_len: int, created: int, permission_id: str) -> Json:
    """`GET /v1/models`, vLLM's `ModelCard` list."""
    permission = {
        "id": permission_id,
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return {"object": "list", "data": [card]}
