"""Forwarding: one agent request to the upstream vLLM through the library's own capture client.

The upstream client is `Collector.http_client(...)`: an httpx client whose transport is the
capture transport, so the request rewrite, the response parser, the stream tee, token-in sessions
and the hand-off to episodes are the in-process ones (there is no second wire parser). The
gateway's part is HTTP plumbing: which episode a request belongs to (set for the duration of the
send through an attribution resolver, `tito_agents.integration`), hop-by-hop headers, and error
statuses when the upstream gives no answer.

Streams are relayed chunk by chunk as the upstream sends them (`aiter_raw`: the bytes as they
came, nothing buffered), so time to first byte is the upstream's. A client that goes away
mid-stream closes the upstream response: the tee records the call INCOMPLETE and the upstream
connection is dropped, which makes vLLM abort the request. (A client that goes away before the
answer is cancelled by `_app`, which watches it while `send` and `read` run.)
"""

from __future__ import annotations

import contextvars
import logging
import types
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from starlette.responses import Response

from tito_agents.integration import Attribution

logger = logging.getLogger("tito_agents.gateway")

_ROUTE: contextvars.ContextVar[Attribution | None] = contextvars.ContextVar(
    "tito_gateway_route", default=None
)


def resolve_route() -> Attribution | None:
    """The attribution resolver the gateway registers: the episode, agent and labels of the
    request being forwarded (None outside a forward, or for a request outside any episode)."""
    return _ROUTE.get()


# Hop-by-hop headers (RFC 9110 §7.6.1) and those the HTTP library sets itself; x-tito-* address
# the gateway and are never sent upstream.
_DROP_REQUEST = frozenset(
    {
        b"host",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
    }
)
_DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"content-length",
        b"date",
        b"server",
    }
)


def request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The agent's headers to send upstream (its Authorization included: vLLM's API key)."""
    return [
        (k, v)
        for k, v in raw
        if (low := k.lower()) not in _DROP_REQUEST and not low.startswith(b"x-tito-")
    ]


def response_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _DROP_RESPONSE]


def is_event_stream(raw: Iterable[tuple[bytes, bytes]]) -> bool:
    for key, value in raw:
        if key.lower() == b"content-type":
            return value.lstrip().lower().startswith(b"text/event-stream")
    return False


def error_body(status: int, message: str, kind: str) -> bytes:
    """An error in vLLM's (and OpenAI's) shape, so every client reads it as from the server."""
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    )


_ERROR_KINDS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "PayloadTooLargeError",
    414: "URITooLongError",
    500: "InternalServerError",
}


def api_error(status: int, message: str, allow: tuple[str, ...] = ()) -> Response:
    """An error the gateway answers itself, in vLLM's shape (`allow`: a 405's methods)."""
    response = Response(
        error_body(status, message, _ERROR_KINDS.get(status, "GatewayError")),
        status,
        media_type="application/json",
    )
    if allow:
        response.headers["allow"] = ", ".join(allow)
    return response


@dataclass(frozen=True, slots=True)
class UpstreamFailure(Exception):
    """The upstream gave no answer: `status` is what the client gets."""

    status: int
    kind: str
    message: str


class Forwarder:
    """Sends agent requests upstream through `client` (a capture client, or a plain one)."""

    def __init__(self, client: Any, upstream_root: str, module: types.ModuleType) -> None:
        self.client = client
        self.root = upstream_root.rstrip("/")
        self._timeout = module.TimeoutException
        self._transport_error = module.TransportError

    async def send(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        route: Attribution | None,
    ) -> Any:
        """The upstream's response, its body not read yet. The capture core snapshots the
        attribution while the request is sent (`route`, read by `resolve_route`)."""
        url = self.root + path + (("?" + query.decode("latin-1")) if query else "")
        request = self.client.build_request(method, url, headers=headers, content=body)
        token = _ROUTE.set(route)
        try:
            return await self.client.send(request, stream=True)
        except self._timeout as exc:
            raise UpstreamFailure(
                504, "GatewayTimeoutError", f"the upstream did not answer in time ({exc!r})"
            ) from exc
        except self._transport_error as exc:
            raise UpstreamFailure(
                503, "ServiceUnavailableError", f"the upstream is unreachable ({exc!r})"
            ) from exc
        finally:
            _ROUTE.reset(token)

    async def read(self, response: Any) -> bytes:
        """A whole (non-stream) body as the upstream sent it (encoded or not, as its headers say)."""
        try:
            return b"".join([chunk async for chunk in response.aiter_raw()])
        except self._transport_error as exc:
            raise UpstreamFailure(
                503, "ServiceUnavailableError", f"the upstream broke off the response ({exc!r})"
            ) from exc
        finally:
            await response.aclose()

    async def relay(
        self, response: Any, abandoned: Callable[[], None] | None = None
    ) -> AsyncIterator[bytes]:
        """The chunks of a stream as they arrive. However the relay ends (the client went away,
        the upstream cut it), the upstream response is closed, shielded from the cancellation
        that ended it, so the tee records the call and the connection is released or dropped.
        `abandoned` is called when the client went away before the end."""
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except (GeneratorExit, anyio.get_cancelled_exc_class()):
            if abandoned is not None:
                abandoned()
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await response.aclose()
