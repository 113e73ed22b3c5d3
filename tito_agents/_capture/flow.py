"""The request flow of the capture transports, written once, without I/O.

`request_flow` is a generator: it decides whether to capture a request, runs a token-in session
plan, rewrites the request, and turns the response into what the caller gets, and whenever it
needs I/O it yields a step (`Send`, `Tokenize`, `Fetch`, `ReadBody`, `Close`) and waits to be sent its
result (or thrown its exception). The sync and async transports in `transport` are two short
runners that perform the steps, so the two paths cannot drift apart (as `sessions.plan` does for
session planning).

An Anthropic Messages request (`/v1/messages`) is sent as vLLM's own chat conversion to
`/v1/chat/completions` (`wire/request.py`), recorded as a chat call, and its answer converted back
(`_messages_answer`): the caller gets what vLLM's `/v1/messages` answers. A request the conversion
leaves to the server, or one the chat endpoint refuses, goes to `/v1/messages` as the caller wrote it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import orjson

from tito_agents._capture import CaptureCore, PendingCall
from tito_agents._capture.decoders import content_decoders as _content_decoders
from tito_agents._capture.messages.probe import probes_needed
from tito_agents._capture.messages.relay import COUNT_TOKENS, MessagesRelay, probe_plan
from tito_agents._capture.messages.reply import (
    ReplyError,
    encode_body,
    error_body,
    messages_response,
)
from tito_agents._capture.wire import endpoint_for_path
from tito_agents.calls import Endpoint, ScoringEndpoint

logger = logging.getLogger("tito_agents")


@dataclass(frozen=True, slots=True)
class Send:
    """Send `request` through the inner transport; the result is its response."""

    request: Any


@dataclass(frozen=True, slots=True)
class Tokenize:
    """Send these `/tokenize` requests (independent: at once where the runner can) and read each
    body; the result is each one's token list, or None where it failed."""

    requests: list[Any]


@dataclass(frozen=True, slots=True)
class Fetch:
    """Send these requests (independent: at once where the runner can) and read each body; the
    result is each one's `(status, body)`, or None where it failed."""

    requests: list[Any]


@dataclass(frozen=True, slots=True)
class ReadBody:
    """Read `response` whole; the result is its body. `decoded`: through the HTTP library's
    decoders (a server compressed it anyway), else the raw chunks (then the response is closed)."""

    response: Any
    decoded: bool


@dataclass(frozen=True, slots=True)
class Close:
    """Close `response` (nothing is sent back)."""

    response: Any


Step = Send | Tokenize | Fetch | ReadBody | Close
Flow = Generator[Step, Any, Any]
"""Yields steps, is sent their results, returns the response for the caller."""
TeeStream = Callable[..., Any]
"""Wraps a response's byte stream so each chunk also feeds the tee (sync or async stream class);
`(stream, tee)`, or `(stream, tee, relay)` where the caller gets what a `MessagesRelay` makes of
the chunks."""


def request_flow(module: Any, core: CaptureCore, request: Any, tee_stream: TeeStream) -> Flow:
    """The whole flow of one request through a capture transport (see the module docstring)."""
    options = yield from _messages_options(module, core, request)
    decided = _decide(core, request, options)
    if decided is None:
        return (yield Send(request))
    body, pending = decided
    messages = pending.info.translated_from == "messages"
    try:
        if pending.plan is not None:
            body = yield from _plan_flow(module, core, request, pending, body)
        chat_path = f"{_api_root(request)}/chat/completions" if messages else None
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
            return (yield from _messages_error(module, original, response))
        return response
    if messages:
        return (yield from _messages_answer(module, core, pending, original, response, tee_stream))
    stream, encoded = _body_kind(response)
    decoders, unreadable = _content_decoders(module, response) if encoded else (None, None)
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
        already = _already_read(response)
        body = already if already is not None else (yield ReadBody(response, decoded=encoded))
    except BaseException:
        core.discard(pending, response.status_code)
        raise
    caller_body = core.finish_body(pending, response.status_code, body)
    return _with_body(module, response, body if caller_body is None else caller_body)


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


def _body_kind(response: Any) -> tuple[bool, bool]:
    """(an SSE stream?, a compressed body?) from one pass over the raw header pairs (`get` on
    httpx headers decodes and joins every match: this runs on every captured call)."""
    stream = encoded = False
    for key, value in response.headers.raw:
        key = key.lower()
        if key == b"content-type":
            stream = value.lstrip().lower().startswith(b"text/event-stream")
        elif key == b"content-encoding":
            encoded = value.strip().lower() not in (b"identity", b"")
    return stream, encoded


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


def _already_read(response: Any) -> bytes | None:
    """The decoded body of a response an inner transport built from bytes (`Response(content=...)`
    reads it at once, and its stream may not be readable a second time), else None."""
    content = getattr(response, "_content", None)
    return content if isinstance(content, bytes) else None


_REPLACED_RESPONSE_HEADERS = (b"content-length", b"content-encoding", b"transfer-encoding")


def _with_body(module: Any, response: Any, body: bytes, status: int | None = None) -> Any:
    """`response` carrying `body` (decoded), already read: the client's own read of it is then a
    no-op instead of a second pass through httpx's decoder and chunker generators (measured:
    about 35 us per call, more than all of capture's parsing). Raw header pairs, as in
    `_rebuild`; `body` is whole and decoded, so it has a length and neither a content nor a
    transfer encoding."""
    headers = [
        (k, v) for k, v in response.headers.raw if k.lower() not in _REPLACED_RESPONSE_HEADERS
    ]
    headers.append((b"content-length", b"%d" % len(body)))
    rebuilt = module.Response(
        response.status_code if status is None else status,
        headers=headers,
        stream=module.ByteStream(body),
        extensions=response.extensions,
    )
    # what `Response(content=...)` ends with, without its generator pass over the body (a later
    # httpx without this attribute just reads the ByteStream: slower, still correct)
    rebuilt._content = body
    return rebuilt


def _api_root(request: Any) -> str:
    """The API path of `request` without its endpoint: "/v1" for ".../v1/chat/completions"."""
    path: str = request.url.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions", "/responses", "/messages"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _scoring_endpoint(request: Any) -> ScoringEndpoint:
    """The server's `/completions`, reached as `request` reached it (its Authorization kept in
    memory only), where a constrained call's ids are re-scored."""
    url = request.url.copy_with(path=f"{_api_root(request)}/completions", query=None)
    auth = request.headers.get("authorization")
    return ScoringEndpoint(str(url), (("authorization", auth),) if auth else ())


def _tokenize_path(api_root: str) -> str:
    """vLLM serves `/tokenize` at its root, not under /v1."""
    return f"{api_root.removesuffix('/v1')}/tokenize"


def _tokenize_request(module: Any, request: Any, payload: dict[str, Any]) -> Any:
    """A `POST /tokenize` to the server of `request`."""
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    return module.Request(
        "POST",
        request.url.copy_with(path=_tokenize_path(_api_root(request)), query=None),
        headers=headers,
        content=orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        extensions=request.extensions,
    )


# ---- Anthropic Messages calls (sent as vLLM's chat conversion; `_capture.messages`) ----


def _messages_options(module: Any, core: CaptureCore, request: Any) -> Flow:
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
    root = _api_root(request)
    path = f"{root}/messages/count_tokens" if kind == COUNT_TOKENS else _tokenize_path(root)
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


def _messages_answer(
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
    stream, encoded = _body_kind(response)
    decoders, unreadable = _content_decoders(module, response) if encoded else (None, None)
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
        relay = MessagesRelay(_content_decoders(module, response)[0] if encoded else None)
        headers = [
            (k, v) for k, v in response.headers.raw if k.lower() not in _REPLACED_RESPONSE_HEADERS
        ]
        return module.Response(
            status,
            headers=headers,
            stream=tee_stream(response.stream, tee, relay),
            extensions=response.extensions,
        )
    try:
        already = _already_read(response)
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
    return _with_body(module, response, answer, status)


def _messages_error(module: Any, original: Any, response: Any) -> Flow:
    """The caller's answer when the chat endpoint answered a Messages call with an error. A
    request error (4xx) is vLLM's own answer to the caller's request: it is sent again, as
    written, to `/v1/messages` (whose checks and wording differ from the chat endpoint's). A
    server error (5xx: overloaded, the engine gone) is not sent again (that would double the
    load and answer uncaptured): its body is given in vLLM's Messages error shape, as
    `/v1/messages` translates it (the client retries as it would)."""
    if response.status_code < 500:
        yield Close(response)
        return (yield Send(original))
    _, encoded = _body_kind(response)
    already = _already_read(response)
    body = already if already is not None else (yield ReadBody(response, decoded=encoded))
    try:
        error = orjson.loads(body)["error"]
        body = encode_body(error_body(error["type"], error["message"]))
    except Exception:  # not vLLM's error shape: passed on as it came
        pass
    return _with_body(module, response, body)
