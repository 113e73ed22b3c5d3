"""What capture adds to a Responses request.

vLLM's `/v1/responses` has no `return_token_ids`; `enable_response_messages: true` (a vLLM
extension, 0.32 for every model and in streams) adds `input_messages[].tokens` (the rendered
prompt ids) and `output_messages[].tokens` (the sampled ids). Rollout logprobs come per output
text token with `include: ["message.output_text.logprobs"]` and `top_logprobs: 0`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tito_agents._capture.wire.request import (
    Prepared,
    RequestInfo,
    UnreadableRequest,
    constraint_of,
    lax_bool,
    lax_int,
    prepares,
    sampling_fields,
)
from tito_agents._capture.wire.splice import extend_container, member_values, set_members
from tito_agents.calls import Endpoint

RESPONSES_LOGPROBS = "message.output_text.logprobs"
"""The `include` entry that asks the Responses API for the logprobs of the output text."""


@prepares(Endpoint.RESPONSES)
def prepare_responses(
    endpoint: Endpoint,
    body: bytes,
    payload: dict[str, Any],
    *,
    capture_logprobs: bool,
    model: str | None,
    options: Mapping[str, Any],
) -> Prepared | None:
    """`prepare_request` for a Responses body: ids through `enable_response_messages`, logprobs
    through `include` + `top_logprobs`; what the caller set is kept (an explicit
    `enable_response_messages: false` means the call is not captured). Logprobs are asked for
    only where the caller's `top_logprobs` is unset or 0: vLLM checks it against the server's
    `--max-logprobs` only when the output logprobs are included, so adding the entry next to
    another value could make the server refuse a request it accepts."""
    added = {"model": orjson.dumps(model)} if model is not None else {}
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
        sampling=sampling_fields(payload),
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
