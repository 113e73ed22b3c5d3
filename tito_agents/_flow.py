"""The request flow of the capture transports, written once, without I/O.

`request_flow` is a generator: it decides whether to capture a request, runs a token-in session
plan, rewrites the request, and turns the response into what the caller gets, and whenever it
needs I/O it yields a step (`Send`, `Tokenize`, `ReadBody`, `Close`) and waits to be sent its
result (or thrown its exception). The sync and async transports in `_transport` are two short
runners that perform the steps, so the two paths cannot drift apart (as `sessions.plan` does for
session planning).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from tito_agents import rescore
from tito_agents._capture import CaptureCore, PendingCall, StreamTee
from tito_agents.calls import ScoringEndpoint

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
class ReadBody:
    """Read `response` whole; the result is its body. `decoded`: through the HTTP library's
    decoders (a server compressed it anyway), else the raw chunks (then the response is closed)."""

    response: Any
    decoded: bool


@dataclass(frozen=True, slots=True)
class Close:
    """Close `response` (nothing is sent back)."""

    response: Any


Step = Send | Tokenize | ReadBody | Close
Flow = Generator[Step, Any, Any]
"""Yields steps, is sent their results, returns the response for the caller."""
TeeStream = Callable[[Any, StreamTee], Any]
"""Wraps a response's byte stream so each chunk also feeds the tee (sync or async stream class)."""


def request_flow(module: Any, core: CaptureCore, request: Any, tee_stream: TeeStream) -> Flow:
    """The whole flow of one request through a capture transport (see the module docstring)."""
    decided = _decide(core, request)
    if decided is None:
        return (yield Send(request))
    body, pending = decided
    try:
        if pending.plan is not None:
            body = yield from _plan_flow(module, core, request, pending, body)
        captured = _rebuild(module, request, body)
    except Exception as exc:  # a capture bug never breaks the call: it goes out uncaptured
        core.abandon(pending, exc)
        return (yield Send(request))
    except BaseException:  # cancelled before it was sent: not in flight any more
        core.discard(pending, None)
        raise
    request = captured
    try:
        response = yield Send(request)
    except BaseException:
        core.discard(pending, None)
        raise
    if not 200 <= response.status_code < 300:
        core.discard(pending, response.status_code)
        return response
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


def _decide(core: CaptureCore, request: Any) -> tuple[bytes, PendingCall] | None:
    """Whether to capture `request`; if so, the body to send (rewritten) and its pending record."""
    try:
        body = request.content
    except Exception:  # a streaming upload: not an OpenAI-style JSON request
        return None
    url = request.url
    decision = core.begin(request.method, url.host, url.port, url.path, body)
    if decision is None:
        return None
    new_body, pending = decision
    try:
        if core.settings.rescore_constrained and rescore.scored_later(pending.info):
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


def _joined(out: bytes | Iterable[bytes]) -> bytes:
    return out if isinstance(out, bytes) else b"".join(out)


class _Decoders:
    """The content decoders of one response as one incremental decoder for the stream tee.

    They are the HTTP library's own (its private `_decoders`), so capture reads exactly what the
    caller's client decodes from the same bytes. Encodings apply in the order listed, so the last
    is undone first. httpx's decoders return bytes, httpx2's yield bounded pieces: both are read
    as bytes here."""

    __slots__ = ("_chain",)

    def __init__(self, decoders: list[Any]) -> None:
        self._chain = decoders[::-1]

    def decode(self, data: bytes) -> bytes:
        for decoder in self._chain:
            data = _joined(decoder.decode(data))
        return data

    def flush(self) -> bytes:
        data = b""
        for decoder in self._chain:
            data = _joined(decoder.decode(data)) + _joined(decoder.flush())
        return data


def _content_decoders(module: Any, response: Any) -> tuple[_Decoders | None, str | None]:
    """For a body a server compressed although capture asked for `identity`: (its decoder, None),
    or (None, the encoding the HTTP library cannot decode, which it would pass on undecoded)."""
    supported = getattr(getattr(module, "_decoders", None), "SUPPORTED_DECODERS", None) or {}
    decoders = []
    for name in response.headers.get_list("content-encoding", split_commas=True):
        name = name.strip().lower()
        if name in ("", "identity"):
            continue
        try:
            decoders.append(supported[name]())
        except Exception:  # unknown here, or a library whose decoders take arguments
            return None, name
    return (_Decoders(decoders) if decoders else None), None


_REPLACED_REQUEST_HEADERS = (b"content-length", b"accept-encoding")


def _rebuild(module: Any, request: Any, body: bytes) -> Any:
    """`request` with `body`, uncompressed responses asked for (the SSE tee reads raw bytes). The
    headers are copied as raw pairs: several times cheaper than a `Headers` copy, per call."""
    headers = [(k, v) for k, v in request.headers.raw if k.lower() not in _REPLACED_REQUEST_HEADERS]
    headers += ((b"accept-encoding", b"identity"), (b"content-length", b"%d" % len(body)))
    rebuilt = module.Request(
        request.method,
        request.url,
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


def _with_body(module: Any, response: Any, body: bytes) -> Any:
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
        response.status_code,
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
    for suffix in ("/chat/completions", "/completions", "/responses"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def _scoring_endpoint(request: Any) -> ScoringEndpoint:
    """The server's `/completions`, reached as `request` reached it (its Authorization kept in
    memory only), where a constrained call's ids are re-scored."""
    url = request.url.copy_with(path=f"{_api_root(request)}/completions", query=None)
    auth = request.headers.get("authorization")
    return ScoringEndpoint(str(url), (("authorization", auth),) if auth else ())


def _tokenize_request(module: Any, request: Any, payload: dict[str, Any]) -> Any:
    """A `POST /tokenize` to the server of `request` (vLLM serves it at the root, not under /v1)."""
    path = _api_root(request).removesuffix("/v1")
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    return module.Request(
        "POST",
        request.url.copy_with(path=f"{path}/tokenize", query=None),
        headers=headers,
        content=orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        extensions=request.extensions,
    )
