"""What capture adds to a chat completions or completions request: `return_token_ids` (vLLM
0.10.2 and later return the prompt and sampled ids with it) and, on demand, `logprobs`.

What capture adds never turns a request the server refuses into one it accepts: `logprobs` is
not added where the caller set a `top_logprobs` other than 0 (vLLM refuses a positive one without
`logprobs`). Nor does it change what the server answers: a completions request with `echo` is sent
as written (`UnreadableRequest`), since `return_token_ids` makes vLLM stop echoing the prompt
text; with the caller's own ids, no `logprobs` is added to it (echoed logprobs would cover the
prompt as well)."""

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
from tito_agents._capture.wire.splice import set_members
from tito_agents.calls import Endpoint

_ADDED_VALUES: dict[bytes, Any] = {b"true": True, b"0": 0}
"""The values of the raw members `prepare_chat` adds."""


@prepares(Endpoint.CHAT, Endpoint.COMPLETIONS)
def prepare_chat(
    endpoint: Endpoint,
    body: bytes,
    payload: dict[str, Any],
    *,
    capture_logprobs: bool,
    model: str | None,
    options: Mapping[str, Any],
) -> Prepared | None:
    """`prepare_request` for a chat or completions body (see the module docstring): None when
    the caller turned ids off (`return_token_ids` false or null)."""
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
    constrained = constraint_of(payload)
    if model is not None:
        added["model"] = orjson.dumps(model)
    new_body = set_members(body, added, payload) if added else None
    for key, value in added.items():
        payload[key] = model if key == "model" else _ADDED_VALUES[value]
    info = RequestInfo(
        endpoint=endpoint,
        stream=bool(stream),
        n=1 if n is None else n,
        sampling=sampling_fields(payload),  # as sent: with what capture added
        wants_logprobs=wants_logprobs,
        messages=messages if type(messages) is list else None,
        tools=tools if type(tools) is list else None,
        include_reasoning=reasoning is not False,
        payload=payload,
        added_ids="return_token_ids" in added,
        added_logprobs="logprobs" in added,
        constrained=constrained,
    )
    return new_body, info
