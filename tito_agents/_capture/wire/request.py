"""Requests, what every endpoint shares: whether a request to a vLLM host is captured, and the
dispatch to the endpoint that adds what capture needs.

`prepare_request` hands a request to the preparation of its endpoint, each in its folder:
`chat/request.py` (chat and completions: `return_token_ids`, `logprobs`), `responses/request.py`
(`enable_response_messages`, the logprobs `include` entry and `top_logprobs`),
`messages/request.py` (an Anthropic Messages request as vLLM's own chat conversion). Each adds
its fields without overriding what the caller set, and records what a trainer needs to interpret
the rollout (`RequestInfo.sampling`). Here: `RequestInfo`, `endpoint_for_path`, the lax readers
of a field as vLLM's pydantic models read it (`lax_bool`, `lax_int`; a value vLLM would refuse
is `UnreadableRequest`: the request is then sent as written, uncaptured, so the caller gets the
server's own error) and `constraint_of`. What is added is spliced into the caller's bytes
(`wire.splice`). Shapes: docs/vllm-wire-format.md."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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


def sampling_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The request's fields that say how it was sampled (`RequestInfo.sampling`)."""
    return {k: v for k, v in payload.items() if k in _SAMPLING_SET}


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
    (`endpoint` is CHAT; `messages/request.py`)."""
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
_CONSTRAINING_KEYS = frozenset(
    {"tool_choice", "response_format", "text", "structured_outputs", *_GUIDED_KEYS}
)
"""The fields `constraint_of` reads a constraint from (`tools` alone constrains nothing)."""


def constraint_of(payload: dict[str, Any]) -> str | None:
    """How the request constrains decoding, as "<field>=<kind>", or None for free sampling.

    vLLM samples a constrained request through a grammar mask and returns the logprobs of the
    masked distribution; a trainer must know which spans those are (`CallSpan.constrained`).
    Constraints: a forced tool choice ("required" or a named function; "auto" and "none" are free),
    `response_format` (chat) or `text.format` (Responses) json_schema / json_object ("text" is
    free), `structured_outputs` (its kind: json, regex, choice, grammar, ...) and the pre-0.12
    `guided_*` fields.
    """
    if _CONSTRAINING_KEYS.isdisjoint(payload):  # most requests: none of the fields below
        return None
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


def _loads(body: bytes) -> dict[str, Any] | None:
    """The request body as a JSON object, or None when it is not one (not captured)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # not strict JSON (NaN, Infinity or worse): sent as written, not read
    return payload if isinstance(payload, dict) else None


Prepared = tuple[bytes | None, RequestInfo]
"""`(new_body, info)`: the body to send (None: the caller's, unchanged) and what capture keeps."""


class Preparer(Protocol):
    """An endpoint's request preparation (`prepare_request` for one endpoint family).

    `body` is the caller's bytes and `payload` their parse (the preparer may update it to what
    is sent); `model` is the policy the request is routed to, None when it names it already;
    `options` are the server's probed conversion choices (read by Messages only)."""

    def __call__(
        self,
        endpoint: Endpoint,
        body: bytes,
        payload: dict[str, Any],
        *,
        capture_logprobs: bool,
        model: str | None,
        options: Mapping[str, Any],
    ) -> Prepared | None: ...


_PREPARERS: dict[Endpoint, Preparer] = {}
P = TypeVar("P", bound=Preparer)


def prepares(*endpoints: Endpoint) -> Callable[[P], P]:
    """Register `preparer` as the request preparation of `endpoints`. Each endpoint folder
    registers its own (`chat/request.py`, `responses/request.py`, `messages/request.py`);
    importing `tito_agents._capture.wire` registers them all."""

    def register(preparer: P) -> P:
        for endpoint in endpoints:
            _PREPARERS[endpoint] = preparer
        return preparer

    return register


def prepare_request(
    endpoint: Endpoint,
    body: bytes,
    *,
    capture_logprobs: bool,
    messages_options: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> Prepared | None:
    """Inspect a JSON request body and add the vLLM fields capture needs (the endpoint's own
    preparation does; see the module docstring).

    Returns `(new_body, info)`; `new_body` is None when the body needs no change (the caller already
    asked for ids). The added fields are spliced into the caller's bytes (`wire.splice`): what
    the caller wrote is sent byte for byte. Returns None when the request is not captured: not a
    JSON object, or the caller explicitly turned ids off. Raises `UnreadableRequest` when a field
    capture reads has a value vLLM would refuse.

    What capture adds never turns a request the server refuses into one it accepts, nor changes
    what the server answers (each endpoint's preparation says how).

    `model`: the policy (model / LoRA adapter name) the request is routed to; its `model` field
    is set to it, in place (`info.routed_from` keeps what the caller wrote when it differed).
    `messages_options`: the server's probed Messages conversion choices (`messages.probe`).
    """
    payload = _loads(body)
    if payload is None:
        return None
    routed = model is not None and payload.get("model") != model
    routed_from = payload.get("model") if routed else None
    prepared = _PREPARERS[endpoint](
        endpoint,
        body,
        payload,
        capture_logprobs=capture_logprobs,
        model=model if routed else None,
        options=messages_options or {},
    )
    if prepared is not None:
        prepared[1].routed_from = routed_from
    return prepared
