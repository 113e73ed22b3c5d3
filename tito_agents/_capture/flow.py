"""The request flow of the capture transports, written once, without I/O.

`request_flow` is a generator: it decides whether to capture a request, runs a token-in session
plan, rewrites the request, and turns the response into what the caller gets, and whenever it
needs I/O it yields a step (`steps`: `Send`, `Tokenize`, `Fetch`, `ReadBody`, `Close`) and waits
to be sent its result (or thrown its exception). The sync and async transports in `transport` are two short
runners that perform the steps, so the two paths cannot drift apart (as `sessions.plan` does for
session planning).

An Anthropic Messages request (`/v1/messages`) is sent as vLLM's own chat conversion to
`/v1/chat/completions` (`messages/request.py`), recorded as a chat call, and its answer converted
back: the caller gets what vLLM's `/v1/messages` answers. Its own steps (the probes of the
server's conversion choices, the answer converted back) are in `messages/flow.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from typing import Any

import orjson

from tito_agents._capture import CaptureCore, PendingCall
from tito_agents._capture.decoders import content_decoders
from tito_agents._capture.messages.flow import messages_answer, messages_error, messages_options
from tito_agents._capture.steps import (
    Close,
    Flow,
    ReadBody,
    Send,
    Step,
    TeeStream,
    Tokenize,
    already_read,
    api_root,
    body_kind,
    tokenize_path,
    with_body,
)
from tito_agents.calls import ScoringEndpoint

logger = logging.getLogger("tito_agents")


def request_flow(module: Any, core: CaptureCore, request: Any, tee_stream: TeeStream) -> Flow:
    """The whole flow of one request through a capture transport (see the module docstring)."""
    options = yield from messages_options(module, core, request)
    decided = _decide(core, request, options)
    if decided is None:
        return (yield Send(request))
    body, pending = decided
    messages = pending.info.translated_from == "messages"
    try:
        if pending.plan is not None:
            body = yield from _plan_flow(module, core, request, pending, body)
        chat_path = f"{api_root(request)}/chat/completions" if messages else None
        captured = _rebuild(module, request, body, chat_path)
    except Exception as exc:  # a capture bug never breaks the call: it goes out uncaptured
        core.abandon(pending, exc)
        return (yield Send(request))
    except BaseException:  # cancelled before it was sent: not in flight any more
        core.discard(pending, None)
        raise
    original, request = request, captured
    try:
        response = yield Send(request)
    except BaseException:
        core.discard(pending, None)
        raise
    if not 200 <= response.status_code < 300:
        core.discard(pending, response.status_code)
        if messages:
            return (yield from messages_error(module, original, response))
        return response
    if messages:
        return (yield from messages_answer(module, core, pending, original, response, tee_stream))
    stream, encoded = body_kind(response)
    decoders, unreadable = content_decoders(module, response) if encoded else (None, None)
    if stream:  # the caller's client decodes its own copy, as without capture
        tee = core.open_stream(
            pending, response.status_code, decompressor=decoders, unreadable=unreadable
        )
        return module.Response(
            response.status_code,
            headers=response.headers,
            stream=tee_stream(response.stream, tee),
            extensions=response.extensions,
        )
    if unreadable is not None:  # recorded; the caller gets the response as it came
        try:
            core.refuse_body(pending, response.status_code, unreadable)
        except BaseException:  # the strict policy fails the call
            yield Close(response)
            raise
        return response
    try:
        already = already_read(response)
        body = already if already is not None else (yield ReadBody(response, decoded=encoded))
    except BaseException:
        core.discard(pending, response.status_code)
        raise
    caller_body = core.finish_body(pending, response.status_code, body)
    return with_body(module, response, body if caller_body is None else caller_body)


def _plan_flow(
    module: Any, core: CaptureCore, request: Any, pending: PendingCall, body: bytes
) -> Generator[Step, Any, bytes]:
    """Drive a token-in session plan, its `/tokenize` asks answered by the runner; a failure
    of the plan or of its I/O falls back to the server's own rendering."""
    plan, decision, started = pending.plan, None, time.perf_counter()
    assert plan is not None
    try:
        asks = next(plan)
        while True:
            tokens = yield Tokenize([_tokenize_request(module, request, ask) for ask in asks])
            asks = plan.send(tokens)
    except StopIteration as stop:
        decision = stop.value
    except Exception:
        logger.warning(
            "token-in session planning failed; the call is rendered by the server", exc_info=True
        )
    body = core.apply_decision(pending, decision, body) or body
    pending.session_ms = (time.perf_counter() - started) * 1000
    return body


def tokens_of(status: int, body: bytes) -> list[int] | None:
    """The token list of a `/tokenize` answer, or None."""
    if status != 200:
        return None
    try:
        tokens = orjson.loads(body).get("tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return tokens if isinstance(tokens, list) else None


# ---- request and response building (the HTTP library's own classes, given as `module`) ----


def _decide(
    core: CaptureCore, request: Any, options: dict[str, Any] | None = None
) -> tuple[bytes, PendingCall] | None:
    """Whether to capture `request`; if so, the body to send (rewritten) and its pending record."""
    try:
        body = request.content
    except Exception:  # a streaming upload: not an OpenAI-style JSON request
        return None
    url = request.url
    decision = core.begin(
        request.method, url.host, url.port, url.path, body, messages_options=options
    )
    if decision is None:
        return None
    new_body, pending = decision
    try:
        if core.settings.rescore_constrained and pending.info.scored_later:
            pending.scoring = _scoring_endpoint(request)
    except Exception:  # not re-scored; the call is still captured
        logger.warning("could not note where to re-score this call", exc_info=True)
    return (body if new_body is None else new_body), pending


_REPLACED_REQUEST_HEADERS = (b"content-length", b"accept-encoding")


def _rebuild(module: Any, request: Any, body: bytes, path: str | None = None) -> Any:
    """`request` with `body`, uncompressed responses asked for (the SSE tee reads raw bytes), to
    `path` (without the query) where given. The headers are copied as raw pairs: several times
    cheaper than a `Headers` copy, per call."""
    headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _REPLACED_REQUEST_HEADERS]
    headers += ((b"accept-encoding", b"identity"), (b"content-length", b"%d" % len(body)))
    url = request.url if path is None else request.url.copy_with(path=path, query=None)
    rebuilt = module.Request(
        request.method,
        url,
        headers=headers,
        stream=module.ByteStream(body),
        extensions=request.extensions,
    )
    rebuilt.read()  # `content` readable, as for a request built from bytes
    return rebuilt


def _scoring_endpoint(request: Any) -> ScoringEndpoint:
    """The server's `/completions`, reached as `request` reached it (its Authorization kept in
    memory only), where a constrained call's ids are re-scored."""
    url = request.url.copy_with(path=f"{api_root(request)}/completions", query=None)
    auth = request.headers.get("authorization")
    return ScoringEndpoint(str(url), (("authorization", auth),) if auth else ())


def _tokenize_request(module: Any, request: Any, payload: dict[str, Any]) -> Any:
    """A `POST /tokenize` to the server of `request`."""
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    return module.Request(
        "POST",
        request.url.copy_with(path=tokenize_path(api_root(request)), query=None),
        headers=headers,
        content=orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        extensions=request.extensions,
    )
