"""The gateway: an OpenAI-compatible HTTP server (Starlette on uvicorn) in front of one vLLM.

Routes:

* `/v1/...`: forwarded; the call joins the episode named by the `X-Tito-Episode` header, else it
  is a call outside any episode (the collector's `outside_episode` policy decides);
* `/episodes/{id}/v1/...` and `/episodes/{id}/agents/{agent}/v1/...`: forwarded inside that
  episode (and agent): the base URL a harness is given, so any client that takes one works;
* `/control/...`: the control API (`_control`), behind its own token;
* `/healthz`: liveness, no token, nothing about episodes beyond a count.

Every path under `v1/` is forwarded the same way (`chat/completions`, `completions`, `responses`,
`models`, ...); which of them are captured is the capture core's decision, not the gateway's.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tito_agents._transport import http_module_of
from tito_agents.collector import Collector
from tito_agents.errors import TitoError
from tito_agents.gateway._control import ControlAPI, json_response
from tito_agents.gateway._forward import (
    Forwarder,
    UpstreamFailure,
    error_body,
    is_event_stream,
    request_headers,
    resolve_route,
    response_headers,
)
from tito_agents.gateway._journal import Journal
from tito_agents.gateway._registry import OpenEpisode, Registry, RegistryError
from tito_agents.integration import Attribution, register_resolver

logger = logging.getLogger("tito_agents.gateway")

_FORWARD_METHODS = ["GET", "POST", "DELETE"]
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

    def app(self) -> Starlette:
        forward = self.forward
        routes = [
            Route("/healthz", self.health, methods=["GET"]),
            Route("/v1/{path:path}", forward, methods=_FORWARD_METHODS),
            Route("/episodes/{episode_id}/v1/{path:path}", forward, methods=_FORWARD_METHODS),
            Route(
                "/episodes/{episode_id}/agents/{agent}/v1/{path:path}",
                forward,
                methods=_FORWARD_METHODS,
            ),
            *self.control.routes(),
        ]
        return Starlette(routes=routes, lifespan=self.lifespan)

    # ---- handlers ----

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok", "open_episodes": len(self.registry.open)})

    async def forward(self, request: Request) -> Response:
        params = request.path_params
        headers = request.headers
        episode_id = params.get("episode_id") or headers.get("x-tito-episode")
        agent = params.get("agent") or headers.get("x-tito-agent")
        held: OpenEpisode | None = None
        if episode_id:
            try:
                held = self.registry.get_open(episode_id)
            except RegistryError as exc:
                return _api_error(exc.status, str(exc))
        body = await _read_body(request, self.config.max_body_bytes)
        if body is None:
            return _api_error(413, "the request body is too large for this gateway")
        route = None
        if held is not None:
            route = Attribution(held.episode, agent, dict(held.labels))
        elif agent:
            route = Attribution(None, agent)
        path = "/v1/" + params["path"]
        forwarder = self._forwarder
        assert forwarder is not None, "the gateway is not started"
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
            return _api_error(400, str(exc))
        if held is not None:
            held.forwarded += 1
            if response.status_code >= 400:
                held.note_failure(response.status_code, path, "the upstream answered with an error")
        raw = response.headers.raw
        out_headers = response_headers(raw)
        if is_event_stream(raw):
            streamed = StreamingResponse(
                forwarder.relay(response), status_code=response.status_code
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

    def _failed(self, held: OpenEpisode | None, path: str, failure: UpstreamFailure) -> Response:
        logger.warning("%s: %s (answered %d)", path, failure.message, failure.status)
        if held is not None:
            held.note_failure(failure.status, path, failure.message)
        return Response(
            error_body(failure.status, failure.message, failure.kind),
            status_code=failure.status,
            media_type="application/json",
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


def _api_error(status: int, message: str) -> Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError"}.get(
        status, "GatewayError"
    )
    return Response(error_body(status, message, kind), status, media_type="application/json")
