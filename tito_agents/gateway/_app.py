"""The gateway: an OpenAI-compatible HTTP server (Starlette on uvicorn) in front of one vLLM.

Routes:

* `/v1/...`: forwarded; the call joins the episode named by the `X-Tito-Episode` header, else it
  is a call outside any episode (the collector's `outside_episode` policy decides);
* `/episodes/{id}/v1/...` and `/episodes/{id}/agents/{agent}/v1/...`: forwarded inside that
  episode (and agent): the base URL a harness is given, so any client that takes one works;
* `/control/...`: the control API (`_control`), behind its own token;
* `/healthz`: liveness, no token, nothing about episodes beyond a count.

Only the model routes of `_routes.MODEL_ROUTES` are forwarded under `v1/` (chat/completions,
completions, responses, models), decided on the raw path before anything decodes it; which of
them are captured is the capture core's decision, not the gateway's. Every error the gateway
answers itself is in vLLM's JSON shape, an internal failure included (a 500, logged with its
cause).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import openai
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from tito_agents.collector import Collector
from tito_agents.errors import TitoError
from tito_agents.gateway._control import ControlAPI, json_response
from tito_agents.gateway._forward import (
    Forwarder,
    UpstreamFailure,
    api_error,
    error_body,
    is_event_stream,
    request_headers,
    resolve_route,
    response_headers,
)
from tito_agents.gateway._journal import Journal
from tito_agents.gateway._registry import OpenEpisode, Registry, RegistryError
from tito_agents.gateway._routes import ModelCall, Refused, check_query, check_raw_path, model_call
from tito_agents.integration import Attribution, http_module_of, register_resolver

T = TypeVar("T")
logger = logging.getLogger("tito_agents.gateway")

UPSTREAM_KEEPALIVE_S = 4.0
"""Idle upstream connections are closed after this (below vLLM's 5 s keep-alive timeout)."""
CLIENT_KEEPALIVE_S = 75
"""How long the gateway keeps an idle agent connection (uvicorn's `timeout_keep_alive`): longer
than clients keep theirs (httpx: 5 s), so it is the client that closes an idle connection and
never sends a request on one the gateway is closing."""


@dataclass(slots=True)
class GatewayConfig:
    """How a gateway forwards (what it captures is the collector's configuration).

    upstream: the vLLM server, its root or its `/v1` base URL.
    control_token: the secret of the control API (never the agent's).
    state_path: the restart journal (`_journal`); None keeps no journal (a restart then cannot
        name the episodes it lost; a clean stop still logs them).
    sessions: token-in sessions for chat and Responses calls (an episode may override it when
        opened).
    """

    upstream: str
    control_token: str
    state_path: Path | None = None
    sessions: bool = False
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    max_connections: int = 1024
    max_body_bytes: int = 64 << 20
    keep_reports: int = 10_000


def upstream_root(upstream: str) -> str:
    """The server root of an upstream given as its root or its OpenAI base URL (`.../v1`)."""
    parts = urlsplit(upstream.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the upstream must be an http(s) URL, not {upstream!r}")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


class Gateway:
    """Forwarding, episodes and the control API of one gateway process (see the module doc)."""

    def __init__(self, collector: Collector, config: GatewayConfig) -> None:
        self.collector = collector
        self.config = config
        self.root = upstream_root(config.upstream)
        journal = Journal(config.state_path) if config.state_path is not None else None
        self.registry = Registry(collector, journal, keep_reports=config.keep_reports)
        self.control = ControlAPI(self.registry, config.control_token)
        self._forwarder: Forwarder | None = None

    # ---- lifetime ----

    async def start(self) -> None:
        register_resolver(resolve_route)
        lost = self.registry.recover()
        if lost:
            logger.warning(
                "%d episodes were open when the previous gateway stopped; none of their calls "
                "were written; they are reported as lost: %s",
                len(lost),
                ", ".join(lost[:20]) + (" ..." if len(lost) > 20 else ""),
            )
        config = self.config
        limits = type(openai.DEFAULT_CONNECTION_LIMITS)(
            max_connections=config.max_connections,
            max_keepalive_connections=config.max_connections,
            # vLLM's server (uvicorn) drops idle connections after 5 s: let them go first, so
            # a request never lands on a connection the server is closing
            keepalive_expiry=UPSTREAM_KEEPALIVE_S,
        )
        client = self.collector.http_client(
            [urlsplit(self.root).hostname or ""],
            sessions=config.sessions,
            timeout=openai.Timeout(config.read_timeout, connect=config.connect_timeout),
            limits=limits,
            follow_redirects=False,
        )
        self._forwarder = Forwarder(client, self.root, http_module_of(client))

    async def stop(self) -> None:
        """Stop forwarding. Open episodes are not written (a half-finished rollout has no
        reward); they are logged, and stay in the journal so the next gateway reports them."""
        opened = list(self.registry.open)
        if opened:
            logger.warning(
                "stopping with %d episodes open; nothing of them is written: %s",
                len(opened),
                ", ".join(opened[:20]) + (" ..." if len(opened) > 20 else ""),
            )
        if self._forwarder is not None:
            await self._forwarder.client.aclose()
            self._forwarder = None
        if self.registry.journal is not None:
            self.registry.journal.close()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    def app(self) -> GatewayApp:
        """The ASGI application (for uvicorn)."""
        control = Starlette(
            routes=[Route("/healthz", self.health, methods=["GET"]), *self.control.routes()],
            lifespan=self.lifespan,
            exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        )
        return GatewayApp(self, control)

    # ---- handlers ----

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok", "open_episodes": len(self.registry.open)})

    async def forward(self, request: Request, call: ModelCall) -> Response:
        """Forward one allow-listed model call; the client is watched until the answer is in
        hand, and a call whose client went away first is cancelled upstream (never a sample)."""
        headers = request.headers
        try:
            episode_id = call.episode_id or _utf8_header(headers.get("x-tito-episode"))
            agent = call.agent or _utf8_header(headers.get("x-tito-agent"))
        except UnicodeDecodeError:
            return api_error(400, "an X-Tito-Episode or X-Tito-Agent header is not UTF-8")
        held: OpenEpisode | None = None
        if episode_id:
            try:
                held = self.registry.get_open(episode_id)
            except RegistryError as exc:
                return api_error(exc.status, str(exc))
        body = await _read_body(request, self.config.max_body_bytes)
        if body is None:
            return api_error(413, "the request body is too large for this gateway")
        route = None
        if held is not None:
            route = Attribution(held.episode, agent, dict(held.labels))
        elif agent:
            route = Attribution(None, agent)
        path = call.upstream_path
        forwarder = self._forwarder
        assert forwarder is not None, "the gateway is not started"
        on_abandoned = functools.partial(_abandoned, held, path)

        async def exchange() -> Response:
            try:
                response = await forwarder.send(
                    request.method,
                    path,
                    request.scope["query_string"],
                    request_headers(request.scope["headers"]),
                    body,
                    route,
                )
            except UpstreamFailure as failure:
                return self._failed(held, path, failure)
            except TitoError as exc:  # e.g. outside_episode="error": refused before it is sent
                return api_error(400, str(exc))
            if held is not None:
                held.forwarded += 1
                if response.status_code >= 400:
                    held.note_failure(
                        response.status_code, path, "the upstream answered with an error"
                    )
            out_headers = response_headers(response.headers.raw)
            if is_event_stream(response.headers.raw):
                streamed = StreamingResponse(
                    forwarder.relay(response, on_abandoned), status_code=response.status_code
                )
                streamed.raw_headers = out_headers
                return streamed
            try:
                content = await forwarder.read(response)
            except UpstreamFailure as failure:
                return self._failed(held, path, failure)
            whole = Response(content, status_code=response.status_code)
            whole.raw_headers = [*out_headers, (b"content-length", b"%d" % len(content))]
            return whole

        answer = await unless_client_leaves(request.receive, exchange)
        if answer is None:  # nobody to answer: what is sent now goes nowhere
            on_abandoned()
            return api_error(499, "the client closed the request")
        return answer

    def _failed(self, held: OpenEpisode | None, path: str, failure: UpstreamFailure) -> Response:
        logger.warning("%s: %s (answered %d)", path, failure.message, failure.status)
        if held is not None:
            held.note_failure(failure.status, path, failure.message)
        return Response(
            error_body(failure.status, failure.message, failure.kind),
            status_code=failure.status,
            media_type="application/json",
        )


class GatewayApp:
    """The gateway's ASGI application: every request's raw path is checked first (`_routes`);
    model calls on the allow-list are forwarded, the rest is the control API and `/healthz`
    (Starlette), and whatever fails inside is answered as a vLLM-shaped 500 and logged with
    its cause, never as a bare one."""

    def __init__(self, gateway: Gateway, control: Starlette) -> None:
        self.gateway = gateway
        self.control = control

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan
            await self.control(scope, receive, send)
            return
        progress = _Progress(send)
        try:
            await self._dispatch(scope, receive, progress.send)
        except ClientDisconnect:  # gone while its request was read: nothing was sent upstream
            logger.info("%s %r: the client went away while sending its request", *_line(scope))
        except Exception as exc:
            if progress.completed:  # answered already (the control API's handler logged it)
                return
            if progress.started:  # returning unfinished makes the server cut the connection
                if not isinstance(exc, OSError):
                    logger.warning("%s %r: the response broke off (%r)", *_line(scope), exc)
                return
            logger.error("internal error on %s %r", *_line(scope), exc_info=exc)
            await _server_error(exc)(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        verdict = check_raw_path(raw_path) or check_query(scope.get("query_string", b""))
        call = model_call(scope["method"], raw_path) if verdict is None else verdict
        if call is None:
            await self.control(scope, receive, send)
            return
        if isinstance(call, Refused):
            level = logging.WARNING if call.status in (400, 414) else logging.INFO
            logger.log(level, "refused %s %r: %s", *_line(scope), call.message)
            response = api_error(call.status, call.message, call.allow)
        else:
            response = await self.gateway.forward(Request(scope, receive), call)
        await response(scope, receive, send)


class _Progress:
    """What an application has sent of its response (to tell an error before the response from
    one in the middle of it)."""

    __slots__ = ("_send", "completed", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = self.completed = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.completed = True
        await self._send(message)


async def unless_client_leaves(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """`work()`'s result, or None when the client disconnected first: `work` is then cancelled
    (an upstream request in flight is dropped, so vLLM aborts it). Needs the request body read
    whole, so that `receive` has nothing left to deliver but the disconnect.

    Plain asyncio (the gateway runs on uvicorn's loop): a watcher task and a done callback,
    several times cheaper per call than an anyio task group (measured: tens of microseconds
    less on a loaded 2-core machine)."""
    current = asyncio.current_task()
    assert current is not None
    state = {"running": True, "gone": False}

    def client_left(watcher: asyncio.Future[None]) -> None:
        if state["running"] and not watcher.cancelled() and watcher.exception() is None:
            state["gone"] = True
            current.cancel()

    watcher = asyncio.ensure_future(_until_disconnect(receive))
    watcher.add_done_callback(client_left)
    try:
        return await work()
    except asyncio.CancelledError:
        if state["gone"] and current.uncancel() == 0:  # ours alone: not the server stopping
            return None
        raise
    finally:
        state["running"] = False
        watcher.cancel()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _abandoned(held: OpenEpisode | None, path: str) -> None:
    logger.info("%s: the client went away before the answer was whole", path)
    if held is not None:
        held.abandoned += 1


def _utf8_header(value: str | None) -> str | None:
    """A header value as the client wrote it: Starlette decodes headers as latin-1, so an agent
    name sent as UTF-8 (`X-Tito-Agent: réviseur`, as Node and curl send it) would become
    `rÃ©viseur` on every sample; the URL form decodes its percent escapes as UTF-8 too."""
    return None if value is None else value.encode("latin-1").decode("utf-8")


def _line(scope: Scope) -> tuple[str, bytes]:
    """A request's method and raw path (its first 200 bytes), for logs (repr'd: the path is the
    client's)."""
    return scope["method"], (scope.get("raw_path") or scope["path"].encode())[:200]


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (control API), in vLLM's error shape."""
    assert isinstance(exc, HTTPException)
    allow = tuple(m.strip() for m in (exc.headers or {}).get("Allow", "").split(",") if m.strip())
    return api_error(exc.status_code, exc.detail, allow)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """The control API's handler of its own failures (Starlette calls it, then re-raises)."""
    if not isinstance(exc, ClientDisconnect):  # GatewayApp notes a client that went away
        logger.error("internal error on %s %r", *_line(request.scope), exc_info=exc)
    return _server_error(exc)


def _server_error(exc: Exception) -> Response:
    """What the client gets when the gateway itself fails: a 500 in vLLM's shape (retryable for
    every OpenAI client); the cause goes to the log, not to the client."""
    return api_error(
        500, f"the gateway failed on this request ({type(exc).__name__}); its log has the cause"
    )


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it passes `limit` bytes (not read further)."""
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)
