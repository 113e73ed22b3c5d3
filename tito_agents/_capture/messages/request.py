"""What capture sends for an Anthropic Messages request.

vLLM's `/v1/messages` has no `return_token_ids`; it converts each request to a chat completion
(`to_chat_completion_request`). Capture sends that same conversion (`convert`) to
`/v1/chat/completions`, where ids are added as for any chat call (`chat/request.py`), and
converts the answer back (`reply`); the call is recorded as a chat call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tito_agents._capture.chat.request import prepare_chat
from tito_agents._capture.messages.convert import chat_request
from tito_agents._capture.messages.probe import probes_needed
from tito_agents._capture.wire.request import Prepared, UnreadableRequest, prepares
from tito_agents.calls import Endpoint


@prepares(Endpoint.MESSAGES)
def prepare_messages(
    endpoint: Endpoint,
    body: bytes,
    payload: dict[str, Any],
    *,
    capture_logprobs: bool,
    model: str | None,
    options: Mapping[str, Any],
) -> Prepared | None:
    """`prepare_request` for a Messages body: its chat conversion prepared as a chat request (the
    body returned is that chat request's, `info.endpoint` is CHAT). `options` are the server's
    probed conversion choices (`merge_inline_system`, `disabled_thinking_effort`; `probe`); a
    request that needs one not known, or that the conversion leaves to the server, is
    `UnreadableRequest` (sent as written)."""
    if model is not None:
        payload["model"] = model  # the chat conversion is a new body: no bytes to keep
    missing = [name for name in probes_needed(payload) if options.get(name) is None]
    if missing:
        raise UnreadableRequest("messages", missing[0], "the server's choice is not known")
    chat = chat_request(payload, **{k: v for k, v in options.items() if v is not None})
    if isinstance(chat, str):
        raise UnreadableRequest("messages", None, chat)
    chat_body = orjson.dumps(chat)
    prepared = prepare_chat(
        Endpoint.CHAT,
        chat_body,
        orjson.loads(chat_body),
        capture_logprobs=capture_logprobs,
        model=None,
        options={},
    )
    if prepared is None:  # not reached: the conversion never turns ids off
        return None
    new_body, info = prepared
    info.translated_from = "messages"
    info.want_message = True  # its tool_use and thinking blocks are noted on the call
    info.sampling = {k: v for k, v in info.sampling.items() if v is not None}
    return (chat_body if new_body is None else new_body), info
