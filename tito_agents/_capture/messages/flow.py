"""The steps of an Anthropic Messages call in the capture flow (`flow.request_flow` calls them).

A Messages request is sent as vLLM's own chat conversion (`request`), so the flow first needs the
server's conversion choices (`messages_options`: probed once per server and model), and at the
end turns the chat answer back into what vLLM's `/v1/messages` answers (`messages_answer`,
`messages_error`). A request the conversion leaves to the server, or one the chat endpoint
refuses, goes to `/v1/messages` as the caller wrote it.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from tito_agents._capture.core import CaptureCore
from tito_agents._capture.decoders import content_decoders
from tito_agents._capture.messages.probe import probes_needed
from tito_agents._capture.messages.relay import COUNT_TOKENS, MessagesRelay, probe_plan
from tito_agents._capture.messages.reply import (
    ReplyError,
    encode_body,
    error_body,
    messages_response,
)
from tito_agents._capture.pending import PendingCall
from tito_agents._capture.steps import (
    REPLACED_RESPONSE_HEADERS,
    Close,
    Fetch,
    Flow,
    ReadBody,
    Send,
    TeeStream,
    already_read,
    api_root,
    body_kind,
    tokenize_path,
    with_body,
)
from tito_agents._capture.wire import endpoint_for_path
from tito_agents.calls import Endpoint

logger = logging.getLogger("tito_agents")


def messages_options(module: Any, core: CaptureCore, request: Any) -> Flow:
    """For a `/v1/messages` request to a vLLM host: the server's conversion choices it needs,
    probed once per (server, model) when a request first needs one (`_capture.messages`);
    None for any other request (nothing is read)."""
    url = request.url
    if (
        request.method != "POST"
        or endpoint_for_path(url.path) is not Endpoint.MESSAGES
        or not core.is_vllm_host(url.host, url.port)
    ):
        return None
    try:
        payload = orjson.loads(request.content)
        model = payload["model"]
    except Exception:  # not a readable Messages request: `_decide` sends it as written
        return None
    if type(model) is not str:
        return None
    known = core.messages_options.setdefault((f"{url.host}:{url.port}", model), {})
    missing = [name for name in probes_needed(payload) if name not in known]
    if missing:
        found: dict[str, Any] = {}
        plan = probe_plan(model, missing)
        try:
            asks = next(plan)
            while True:
                answers = yield Fetch([_probe_request(request, ask) for ask in asks])
                asks = plan.send(answers)
        except StopIteration as stop:
            found = stop.value
        except Exception:  # unknown choices: requests that need them go uncaptured
            logger.warning("could not probe the server's Messages conversion", exc_info=True)
        for name in missing:
            known[name] = found.get(name)
    return dict(known)


def _probe_request(request: Any, ask: tuple[str, dict[str, Any]]) -> Any:
    """A probe request to the server of `request`, with its headers (its credentials)."""
    kind, payload = ask
    root = api_root(request)
    path = f"{root}/messages/count_tokens" if kind == COUNT_TOKENS else tokenize_path(root)
    headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _PROBE_DROPPED]
    headers += ((b"content-type", b"application/json"), (b"accept-encoding", b"identity"))
    return type(request)(
        "POST",
        request.url.copy_with(path=path, query=None),
        headers=headers,
        content=orjson.dumps(payload),
        extensions=request.extensions,
    )


_PROBE_DROPPED = (b"content-length", b"accept-encoding", b"content-type")


def messages_answer(
    module: Any,
    core: CaptureCore,
    pending: PendingCall,
    original: Any,
    response: Any,
    tee_stream: TeeStream,
) -> Flow:
    """What the caller of a Messages call gets from its 2xx chat answer (recorded as a chat
    call): vLLM's Messages body, or its Messages events relayed as the chunks arrive."""
    status = response.status_code
    stream, encoded = body_kind(response)
    decoders, unreadable = content_decoders(module, response) if encoded else (None, None)
    if unreadable is not None:  # neither the call nor the answer can be read: vLLM's own
        try:
            core.refuse_body(pending, status, unreadable)
        except BaseException:  # the strict policy fails the call
            yield Close(response)
            raise
        yield Close(response)
        return (yield Send(original))
    if stream:
        tee = core.open_stream(pending, status, decompressor=decoders)
        relay = MessagesRelay(content_decoders(module, response)[0] if encoded else None)
        headers = [
            (k, v) for k, v in response.headers.raw if k.lower() not in REPLACED_RESPONSE_HEADERS
        ]
        return module.Response(
            status,
            headers=headers,
            stream=tee_stream(response.stream, tee, relay),
            extensions=response.extensions,
        )
    try:
        already = already_read(response)
        body = already if already is not None else (yield ReadBody(response, decoded=encoded))
    except BaseException:
        core.discard(pending, status)
        raise
    chat = core.finish_body_parsed(pending, status, body)
    try:
        answer = encode_body(messages_response(chat if chat is not None else orjson.loads(body)))
    except ReplyError as error:  # vLLM's converter fails on this answer the same way
        answer, status = encode_body(error.body), error.status
    except Exception:  # an answer this converter cannot read (a bug): vLLM's own, uncaptured view
        logger.warning("could not convert a chat answer to a Messages answer", exc_info=True)
        return (yield Send(original))
    return with_body(module, response, answer, status)


def messages_error(module: Any, original: Any, response: Any) -> Flow:
    """The caller's answer when the chat endpoint answered a Messages call with an error. A
    request error (4xx) is vLLM's own answer to the caller's request: it is sent again, as
    written, to `/v1/messages` (whose checks and wording differ from the chat endpoint's). A
    server error (5xx: overloaded, the engine gone) is not sent again (that would double the
    load and answer uncaptured): its body is given in vLLM's Messages error shape, as
    `/v1/messages` translates it (the client retries as it would)."""
    if response.status_code < 500:
        yield Close(response)
        return (yield Send(original))
    _, encoded = body_kind(response)
    already = already_read(response)
    body = already if already is not None else (yield ReadBody(response, decoded=encoded))
    try:
        error = orjson.loads(body)["error"]
        body = encode_body(error_body(error["type"], error["message"]))
    except Exception:  # not vLLM's error shape: passed on as it came
        pass
    return with_body(module, response, body)
