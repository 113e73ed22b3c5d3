"""Requests: whether a request to a vLLM host is captured, and what is added to it.

`prepare_request` adds `return_token_ids` (and logprobs on demand) without overriding what the
caller set, and records what a trainer needs to interpret the rollout (`RequestInfo.sampling`).
Shapes: docs/vllm-wire-format.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tito_agents.calls import Endpoint

_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "logprobs",
    "top_logprobs",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "tool_choice",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "max_output_tokens",
    "text",
    "reasoning",
)
_SAMPLING_SET = frozenset(_SAMPLING_KEYS)

# --------------------------------------------------------------------------------------------------
# Requests
#
# `sampling` keeps what a trainer needs to interpret the rollout logprobs: temperature and top-p, the
# logprob settings, and whether decoding was constrained (tool_choice "required"/named, structured
# outputs): vLLM computes logprobs after the grammar mask, so constrained tokens carry the logprob
# of the masked distribution, not of the free model.


@dataclass(slots=True)
class RequestInfo:
    """What the capture layer needs to remember about a request it rewrote."""

    endpoint: Endpoint
    stream: bool
    n: int
    sampling: dict[str, Any]
    wants_logprobs: bool
    messages: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    include_reasoning: bool = True
    payload: dict[str, Any] | None = None
    """The parsed request body (token-in sessions rewrite it)."""
    want_message: bool = False
    """Keep each choice's assistant message (token-in sessions compare it with the next request)."""
    added_ids: bool = False
    """Capture added `return_token_ids` (the caller did not ask for ids)."""
    added_logprobs: bool = False
    """Capture added `logprobs` (the caller did not ask for them)."""
    constrained: str | None = None
    """How decoding was constrained (`constraint_of`), None for free sampling."""
    added_top_logprobs: bool = False
    """Responses API: capture added `top_logprobs: 0` (with its `include` entry)."""


_GUIDED_KEYS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def constraint_of(payload: dict[str, Any]) -> str | None:
    """How the request constrains decoding, as "<field>=<kind>", or None for free sampling.

    vLLM samples a constrained request through a grammar mask and returns the logprobs of the
    masked distribution; a trainer must know which spans those are (`CallSpan.constrained`).
    Constraints: a forced tool choice ("required" or a named function; "auto" and "none" are free),
    `response_format` (chat) or `text.format` (Responses) json_schema / json_object ("text" is
    free), `structured_outputs` (its kind: json, regex, choice, grammar, ...) and the pre-0.12
    `guided_*` fields.
    """
    choice = payload.get("tool_choice")
    if payload.get("tools") and choice == "required":
        return "tool_choice=required"
    if payload.get("tools") and isinstance(choice, dict):
        return "tool_choice=named"
    fmt = payload.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        return f"response_format={fmt['type']}"
    text = payload.get("text")  # the Responses API's structured output
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        return f"text.format={fmt['type']}"
    structured = payload.get("structured_outputs")
    if isinstance(structured, dict):
        kinds = sorted(k for k, v in structured.items() if v is not None and v is not False)
        kinds = [k for k in kinds if k not in _STRUCTURED_OPTIONS]
        if kinds:
            return f"structured_outputs={'+'.join(kinds)}"
    for key in _GUIDED_KEYS:
        if payload.get(key) is not None:
            return key
    return None


_STRUCTURED_OPTIONS = frozenset(
    {
        "disable_fallback",
        "disable_any_whitespace",
        "disable_additional_properties",
        "whitespace_pattern",
        "backend",
        "_backend",
        "_backend_was_auto",
    }
)
"""Keys of `structured_outputs` that tune a constraint without being one."""


def endpoint_for_path(path: str) -> Endpoint | None:
    """The endpoint a POST path targets, or None when the path is not one we capture."""
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return Endpoint.CHAT
    if path.endswith("/completions"):
        return Endpoint.COMPLETIONS
    if path.endswith("/responses"):
        return Endpoint.RESPONSES
    return None


def prepare_request(
    endpoint: Endpoint, body: bytes, *, capture_logprobs: bool
) -> tuple[bytes | None, RequestInfo] | None:
    """Inspect a JSON request body and add the vLLM fields capture needs.

    Returns `(new_body, info)`; `new_body` is None when the body needs no change (the caller already
    asked for ids). Returns None when the request is not captured: not a JSON object, or the caller
    explicitly set `return_token_ids: false`.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    if endpoint is Endpoint.RESPONSES:
        return _prepare_responses(payload, capture_logprobs=capture_logprobs)
    added_ids = added_logprobs = False
    if "return_token_ids" not in payload:
        payload["return_token_ids"] = True
        added_ids = True
    elif payload["return_token_ids"] is not True:
        return None
    if capture_logprobs and payload.get("logprobs") is None:
        # chat: a boolean; legacy completions: an int top-k count, 0 = only the sampled token
        payload["logprobs"] = True if endpoint is Endpoint.CHAT else 0
        added_logprobs = True
    asked = payload.get("logprobs")
    chat = endpoint is Endpoint.CHAT
    wants_logprobs = asked is True if chat else (type(asked) is int and asked >= 0)
    messages = payload.get("messages") if chat else None
    tools = payload.get("tools")
    info = RequestInfo(
        endpoint=endpoint,
        stream=bool(payload.get("stream")),
        n=int(payload.get("n") or 1),
        # a request has a handful of keys: test those, not every sampling key
        sampling={k: v for k, v in payload.items() if k in _SAMPLING_SET},
        wants_logprobs=wants_logprobs,
        messages=messages if type(messages) is list else None,
        tools=tools if type(tools) is list else None,
        include_reasoning=payload.get("include_reasoning", True) is not False,
        payload=payload,
        added_ids=added_ids,
        added_logprobs=added_logprobs,
        constrained=constraint_of(payload),
    )
    changed = added_ids or added_logprobs
    return (orjson.dumps(payload) if changed else None), info


# --------------------------------------------------------------------------------------------------
# Responses API
#
# vLLM's `/v1/responses` has no `return_token_ids`; `enable_response_messages: true` (a vLLM
# extension, 0.32 for every model and in streams) adds `input_messages[].tokens` (the rendered
# prompt ids) and `output_messages[].tokens` (the sampled ids). Rollout logprobs come per output
# text token with `include: ["message.output_text.logprobs"]` and `top_logprobs: 0`.

RESPONSES_LOGPROBS = "message.output_text.logprobs"
"""The `include` entry that asks the Responses API for the logprobs of the output text."""


def _prepare_responses(
    payload: dict[str, Any], *, capture_logprobs: bool
) -> tuple[bytes | None, RequestInfo] | None:
    """`prepare_request` for a Responses body: ids through `enable_response_messages`, logprobs
    through `include` + `top_logprobs`; what the caller set is kept (an explicit
    `enable_response_messages: false` means the call is not captured)."""
    added_ids = added_logprobs = False
    if "enable_response_messages" not in payload:
        payload["enable_response_messages"] = True
        added_ids = True
    elif payload["enable_response_messages"] is not True:
        return None
    include = payload.get("include")
    asked = type(include) is list and RESPONSES_LOGPROBS in include
    if capture_logprobs and not asked and (include is None or type(include) is list):
        payload["include"] = [*(include or ()), RESPONSES_LOGPROBS]
        added_top = payload.get("top_logprobs") is None
        if added_top:
            payload["top_logprobs"] = 0
        added_logprobs = asked = True
    else:
        added_top = False
    tools = payload.get("tools")
    info = RequestInfo(
        endpoint=Endpoint.RESPONSES,
        stream=bool(payload.get("stream")),
        n=1,
        sampling={k: v for k, v in payload.items() if k in _SAMPLING_SET},
        wants_logprobs=asked,
        messages=None,
        tools=tools if type(tools) is list else None,
        payload=payload,
        added_ids=added_ids,
        added_logprobs=added_logprobs,
        constrained=constraint_of(payload),
        added_top_logprobs=added_top,
    )
    changed = added_ids or added_logprobs
    return (orjson.dumps(payload) if changed else None), info
