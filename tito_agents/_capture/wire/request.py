"""Requests: whether a request to a vLLM host is captured, and what is added to it.

`prepare_request` adds `return_token_ids` (and logprobs on demand) without overriding what the
caller set, and records what a trainer needs to interpret the rollout (`RequestInfo.sampling`).
It reads the fields it needs as vLLM's pydantic models do (lax mode) and gives up on a value vLLM
would refuse (`UnreadableRequest`: the request is then sent as written, uncaptured, so the caller
gets the server's own error); what it adds is spliced into the caller's bytes (`wire.splice`).
Shapes: docs/vllm-wire-format.md."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tito_agents._capture.messages.convert import chat_request
from tito_agents._capture.messages.probe import probes_needed
from tito_agents._capture.wire.splice import extend_container, member_values, set_members
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
    "min_tokens",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
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
# `sampling` keeps what a trainer needs to interpret the rollout logprobs: temperature, top-p, top-k
# and min-p (the truncation the engine sampled under), what reshapes the logits before them
# (penalties, logit_bias, allowed_token_ids, bad_words, min_tokens; `tito_agents.sampling`), the
# seed, the logprob settings, and whether decoding was constrained (tool_choice "required"/named, structured
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
    translated_from: str | None = None
    """"messages": the caller's Anthropic Messages request, sent as vLLM's own chat conversion
    (`endpoint` is CHAT; `prepare_request` of `Endpoint.MESSAGES`)."""
    routed_from: Any = None
    """The `model` the caller wrote when a policy mapping sent the request to another model
    (`prepare_request(model=...)`); None when the request names the model it was sent with."""

    @property
    def scored_later(self) -> bool:
        """Whether this call may need re-scoring at the episode's end (re-scoring on): a
        constrained one (masked logprobs), or a Responses one that asks for logprobs (vLLM 0.32
        leaves out those of function-call and reasoning tokens and of a stream's EOS). Capture
        notes where to re-score such a call; export's `rescore` decides from the call itself."""
        return self.constrained is not None or (
            self.endpoint is Endpoint.RESPONSES and self.wants_logprobs
        )


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
    if path.endswith("/messages"):  # not /messages/count_tokens nor /messages/render
        return Endpoint.MESSAGES
    return None


class UnreadableRequest(Exception):
    """A field capture reads holds a value it cannot read (`field`: which one): the request is
    sent as the caller wrote it, uncaptured, and the server gives its own answer."""

    def __init__(self, field: str, value: Any = None, why: str = "") -> None:
        super().__init__(f"{field} = {_shown(value)}" + (f" ({why})" if why else ""))
        self.field = field


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


_TRUE = frozenset({"true", "t", "yes", "y", "on", "1"})
_FALSE = frozenset({"false", "f", "no", "n", "off", "0"})
_INT_TEXT = re.compile(r"\s*[+-]?\d+(?:_\d+)*(?:\.0+)?\s*", re.ASCII)


def lax_bool(payload: Mapping[str, Any], field: str) -> bool | None:
    """A boolean field as vLLM's pydantic models read it (lax mode: "true", 1, "off", ...);
    None when absent or null. Raises `UnreadableRequest` on what pydantic refuses."""
    value = payload.get(field)
    if value is None or type(value) is bool:
        return value
    if type(value) in (int, float) and value in (0, 1):
        return bool(value)
    if type(value) is str and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise UnreadableRequest(field, value)


def lax_int(payload: Mapping[str, Any], field: str) -> int | None:
    """An integer field as pydantic's lax mode reads it ("2", "2.0", 2.0 and True are
    integers); None when absent or null. Raises `UnreadableRequest` on what pydantic refuses."""
    value = payload.get(field)
    if value is None:
        return None
    if type(value) in (int, bool):
        return int(value)
    if type(value) is float and value.is_integer() and abs(value) < 2.0**63:
        return int(value)
    if type(value) is str and _INT_TEXT.fullmatch(value):
        return int(value.strip().partition(".")[0])
    raise UnreadableRequest(field, value)


_ADDED_VALUES: dict[bytes, Any] = {b"true": True, b"0": 0}
"""The values of the raw members `prepare_request` adds to chat and completions requests."""


def _loads(body: bytes) -> dict[str, Any] | None:
    """The request body as a JSON object, or None when it is not one (not captured)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # not strict JSON (NaN, Infinity or worse): sent as written, not read
    return payload if isinstance(payload, dict) else None


def prepare_request(
    endpoint: Endpoint,
    body: bytes,
    *,
    capture_logprobs: bool,
    messages_options: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> tuple[bytes | None, RequestInfo] | None:
    """Inspect a JSON request body and add the vLLM fields capture needs.

    Returns `(new_body, info)`; `new_body` is None when the body needs no change (the caller already
    asked for ids). The added fields are spliced into the caller's bytes (`wire.splice`): what
    the caller wrote is sent byte for byte. Returns None when the request is not captured: not a
    JSON object, or the caller explicitly turned ids off (`return_token_ids: false`). Raises
    `UnreadableRequest` when a field capture reads has a value vLLM would refuse.

    What capture adds never turns a request the server refuses into one it accepts: `logprobs`
    is not added where the caller set a `top_logprobs` other than 0 (vLLM refuses a positive
    one without `logprobs`). Nor does it change what the server answers: a completions request
    with `echo` is sent as written (`UnreadableRequest`), since `return_token_ids` makes vLLM
    stop echoing the prompt text; with the caller's own ids, no `logprobs` is added to it
    (echoed logprobs would cover the prompt as well).

    An Anthropic Messages request (`Endpoint.MESSAGES`) becomes the chat request vLLM runs for it
    (`_prepare_messages`): the body returned is that chat request's, `info.endpoint` is CHAT.

    `model`: the policy (model / LoRA adapter name) the request is routed to; its `model` field
    is set to it, in place (`info.routed_from` keeps what the caller wrote when it differed).
    """
    payload = _loads(body)
    if payload is None:
        return None
    routed = model is not None and payload.get("model") != model
    routed_from = payload.get("model") if routed else None
    if endpoint is Endpoint.MESSAGES:
        if routed:
            payload["model"] = model  # the chat conversion is a new body: no bytes to keep
        prepared = _prepare_messages(payload, capture_logprobs, messages_options or {})
        return _routed(prepared, routed_from)
    if endpoint is Endpoint.RESPONSES:
        added_model = {"model": orjson.dumps(model)} if routed else {}
        prepared = _prepare_responses(
            body, payload, capture_logprobs=capture_logprobs, added=added_model
        )
        return _routed(prepared, routed_from)
    chat = endpoint is Endpoint.CHAT
    added: dict[str, bytes] = {}
    ids = lax_bool(payload, "return_token_ids")
    if "return_token_ids" not in payload:
        added["return_token_ids"] = b"true"
    elif ids is not True:
        return None  # the caller turned ids off (false or null): not captured
    echo = None if chat else lax_bool(payload, "echo")
    if echo and "return_token_ids" in added:
        # vLLM (0.10.2 to 0.32) stops echoing the prompt text when ids are asked for: adding
        # them would change the caller's answer, so the request goes as written
        raise UnreadableRequest("echo", echo, "ids would stop vLLM echoing the prompt")
    asked = lax_bool(payload, "logprobs") if chat else lax_int(payload, "logprobs")
    top = lax_int(payload, "top_logprobs") if chat else None
    if capture_logprobs and asked is None and top in (None, 0) and not echo:
        # chat: a boolean; legacy completions: an int top-k count, 0 = only the sampled token
        added["logprobs"] = b"true" if chat else b"0"
        asked = True if chat else 0
    n = lax_int(payload, "n")
    stream = lax_bool(payload, "stream")
    reasoning = lax_bool(payload, "include_reasoning")
    wants_logprobs = asked is True if chat else (type(asked) is int and asked >= 0)
    messages = payload.get("messages") if chat else None
    tools = payload.get("tools")
    sampling = {k: v for k, v in payload.items() if k in _SAMPLING_SET}
    constrained = constraint_of(payload)
    if routed:
        added["model"] = orjson.dumps(model)
    new_body = set_members(body, added, payload) if added else None
    if added:
        payload.update(
            (key, _ADDED_VALUES[value]) for key, value in added.items() if key != "model"
        )
    if routed:
        payload["model"] = model
    info = RequestInfo(
        endpoint=endpoint,
        stream=bool(stream),
        n=1 if n is None else n,
        # a request has a handful of keys: test those, not every sampling key
        sampling={**sampling, **{k: payload[k] for k in added if k in _SAMPLING_SET}},
        wants_logprobs=wants_logprobs,
        messages=messages if type(messages) is list else None,
        tools=tools if type(tools) is list else None,
        include_reasoning=reasoning is not False,
        payload=payload,
        added_ids="return_token_ids" in added,
        added_logprobs="logprobs" in added,
        constrained=constrained,
        routed_from=routed_from,
    )
    return new_body, info


def _routed(
    prepared: tuple[bytes | None, RequestInfo] | None, routed_from: Any
) -> tuple[bytes | None, RequestInfo] | None:
    if prepared is not None:
        prepared[1].routed_from = routed_from
    return prepared


# --------------------------------------------------------------------------------------------------
# Anthropic Messages API
#
# vLLM's `/v1/messages` has no `return_token_ids`; it converts each request to a chat completion
# (`to_chat_completion_request`). Capture sends that same conversion (`messages.convert`) to
# `/v1/chat/completions`, where ids are added as for any chat call, and converts the answer back
# (`messages.reply`); the call is recorded as a chat call.


def _prepare_messages(
    payload: dict[str, Any], capture_logprobs: bool, options: Mapping[str, Any]
) -> tuple[bytes | None, RequestInfo] | None:
    """`prepare_request` for a Messages body: its chat conversion prepared as a chat request.
    `options` are the server's probed conversion choices (`merge_inline_system`,
    `disabled_thinking_effort`; `messages.probe`); a request that needs one not known, or
    that the conversion leaves to the server, is `UnreadableRequest` (sent as written)."""
    missing = [name for name in probes_needed(payload) if options.get(name) is None]
    if missing:
        raise UnreadableRequest("messages", missing[0], "the server's choice is not known")
    chat = chat_request(payload, **{k: v for k, v in options.items() if v is not None})
    if isinstance(chat, str):
        raise UnreadableRequest("messages", None, chat)
    chat_body = orjson.dumps(chat)
    prepared = prepare_request(Endpoint.CHAT, chat_body, capture_logprobs=capture_logprobs)
    if prepared is None:  # not reached: the conversion never turns ids off
        return None
    new_body, info = prepared
    info.translated_from = "messages"
    info.want_message = True  # its tool_use and thinking blocks are noted on the call
    info.sampling = {k: v for k, v in info.sampling.items() if v is not None}
    return (chat_body if new_body is None else new_body), info


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
    body: bytes,
    payload: dict[str, Any],
    *,
    capture_logprobs: bool,
    added: dict[str, bytes] | None = None,
) -> tuple[bytes | None, RequestInfo] | None:
    """`prepare_request` for a Responses body: ids through `enable_response_messages`, logprobs
    through `include` + `top_logprobs`; what the caller set is kept (an explicit
    `enable_response_messages: false` means the call is not captured). Logprobs are asked for
    only where the caller's `top_logprobs` is unset or 0: vLLM checks it against the server's
    `--max-logprobs` only when the output logprobs are included, so adding the entry next to
    another value could make the server refuse a request it accepts. `added`: members already
    to be set (the routed `model`)."""
    added = dict(added or {})
    wanted = lax_bool(payload, "enable_response_messages")
    if "enable_response_messages" not in payload:
        added["enable_response_messages"] = b"true"
    elif wanted is not True:
        return None
    include = payload.get("include")
    if include is not None and type(include) is not list:
        raise UnreadableRequest("include", include)
    top = lax_int(payload, "top_logprobs")
    stream = lax_bool(payload, "stream")
    asked = include is not None and RESPONSES_LOGPROBS in include
    added_top = False
    if capture_logprobs and not asked and top in (None, 0):
        entry = orjson.dumps(RESPONSES_LOGPROBS)
        if include is None:
            added["include"] = b"[" + entry + b"]"
        else:  # the caller's own list, its bytes kept, with the entry at its end
            start, end = member_values(body)["include"]
            added["include"] = extend_container(body[start:end], entry, empty=not include)
        if top is None:
            added["top_logprobs"] = b"0"
            added_top = True
        asked = True
    new_body = set_members(body, added, payload) if added else None
    for key, value in added.items():
        payload[key] = orjson.loads(value)
    tools = payload.get("tools")
    info = RequestInfo(
        endpoint=Endpoint.RESPONSES,
        stream=bool(stream),
        n=1,
        sampling={k: v for k, v in payload.items() if k in _SAMPLING_SET},
        wants_logprobs=asked,
        messages=None,
        tools=tools if type(tools) is list else None,
        payload=payload,
        added_ids="enable_response_messages" in added,
        added_logprobs="include" in added,
        constrained=constraint_of(payload),
        added_top_logprobs=added_top,
    )
    return new_body, info
