"""Which request paths the gateway forwards: an allow-list of model routes, checked on the raw path.

An agent's base URL forwards model calls and nothing else. vLLM serves far more than model calls
on the same root — sleep and wake-up, cache resets, `collective_rpc`, the RL weight-update routes
(`/pause`, `/update_weights`, ...), LoRA loading under `/v1`, profiling, metrics — and its
`--api-key` guards none of the dev and RL ones. So the gateway forwards only the routes listed in
`MODEL_ROUTES`, and decides on the path exactly as the client sent it (ASGI `raw_path`), before
anything decodes it: a path that could mean something else once decoded or normalized (dot
segments, encoded `/`, `\\` or `.`, empty segments, control bytes) is refused with 400, a path
outside the list with 404, a listed path with another method with 405. What goes upstream is
`/v1/` and the listed route as received (plain ASCII), never a decoded form, so no later
normalization (httpx removes dot segments) can turn it into another route.

Pure: no I/O, tested with literals (`tests/unit/test_gateway_routes.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

MODEL_ROUTES: dict[str, tuple[str, ...]] = {
    "chat/completions": ("POST",),
    "completions": ("POST",),
    "responses": ("POST",),
    "messages": ("POST",),
    "messages/count_tokens": ("POST",),
    "models": ("GET",),
    "models/{id}": ("GET",),
}
"""The routes under the upstream's `/v1` that are forwarded, with their methods. `{id}` is one
path segment. `messages` is Anthropic's Messages API (captured, sent as vLLM's chat conversion),
`messages/count_tokens` its token count (forwarded, not a call). To forward another model route,
add it here and to docs/gateway.md."""

MAX_PATH_BYTES = 2048
"""Longer request paths are refused (414): no model route or episode URL comes near it."""

_PATH_CHARS = re.compile(rb"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")
"""RFC 3986 path characters (unreserved, sub-delims, `:`, `@`, `/`, percent escapes)."""
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_ROUTE_SEGMENT = re.compile(rb"[A-Za-z0-9\-._~!$&'()*+,;=:@]+")
"""A segment of a forwarded route: plain characters only (no percent escapes)."""
_FORBIDDEN_ESCAPED = frozenset(b"/\\.%") | frozenset(range(0x20)) | {0x7F}
"""What a percent escape may not stand for: separators, dots, a second round of escapes, and
control bytes (NUL included)."""
_QUERY_CHARS = re.compile(rb"[\x21-\x22\x24-\x7e]*")
"""A forwarded query: visible ASCII without `#`."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A request the gateway answers itself: `status` and a message for the error body."""

    status: int
    message: str
    allow: tuple[str, ...] = ()
    """For 405: the methods the route accepts."""


@dataclass(frozen=True, slots=True)
class ModelCall:
    """A request to forward: `upstream_path` (`/v1/...`, as received), and the episode and agent
    its URL names (None: from the `X-Tito-*` headers, if any)."""

    upstream_path: str
    episode_id: str | None
    agent: str | None


def check_raw_path(raw_path: bytes) -> Refused | None:
    """Why `raw_path` (any request's path, as sent) is refused, or None when it is plain: it
    starts with `/`, has only RFC 3986 path characters, no empty, `.` or `..` segment, and no
    percent escape of a separator, a dot, `%` or a control byte; its escapes decode to UTF-8."""
    if len(raw_path) > MAX_PATH_BYTES:
        return Refused(414, f"the request path is longer than {MAX_PATH_BYTES} bytes")
    if not raw_path.startswith(b"/"):
        return Refused(400, "the request target must be a path starting with '/'")
    if not _PATH_CHARS.fullmatch(raw_path):
        return Refused(400, "the request path has characters outside RFC 3986 (e.g. '\\')")
    if raw_path != b"/":
        for segment in raw_path[1:].split(b"/"):
            if segment in (b"", b".", b".."):
                return Refused(400, "the request path has an empty, '.' or '..' segment")
    if b"%" in raw_path:
        escapes = _ESCAPE.findall(raw_path)
        if len(escapes) != raw_path.count(b"%"):
            return Refused(400, "the request path has a malformed percent escape")
        if any(int(hex_digits, 16) in _FORBIDDEN_ESCAPED for hex_digits in escapes):
            return Refused(
                400, "the request path has an encoded '/', '\\', '.', '%' or control character"
            )
        try:
            unquote_to_bytes(raw_path).decode("utf-8")
        except UnicodeDecodeError:
            return Refused(400, "the request path does not decode to UTF-8")
    return None


def check_query(query: bytes) -> Refused | None:
    if _QUERY_CHARS.fullmatch(query):
        return None
    return Refused(400, "the query string has characters that are not visible ASCII")


def model_call(method: str, raw_path: bytes) -> ModelCall | Refused | None:
    """What a request is, from its method and raw path (already passed `check_raw_path`):
    a model call to forward, a refusal (404 off the allow-list, 405 another method), or None
    when the path is not an agent URL at all (the control API, `/healthz`)."""
    segments = raw_path[1:].split(b"/")
    episode_id = agent = None
    if segments[0] == b"v1":
        route = segments[1:]
    elif len(segments) >= 3 and segments[0] == b"episodes" and segments[2] == b"v1":
        episode_id, route = _name(segments[1]), segments[3:]
    elif (
        len(segments) >= 5
        and segments[0] == b"episodes"
        and segments[2] == b"agents"
        and segments[4] == b"v1"
    ):
        episode_id, agent, route = _name(segments[1]), _name(segments[3]), segments[5:]
    else:
        return None
    allowed = _allowed_methods(route)
    if allowed is None:
        return Refused(404, f"the gateway forwards model routes only ({', '.join(routes())})")
    if method not in allowed:
        return Refused(405, f"this route takes {' or '.join(allowed)}", allowed)
    return ModelCall("/v1/" + b"/".join(route).decode("ascii"), episode_id, agent)


def routes() -> list[str]:
    """The forwarded routes, as `/v1/...` paths (for messages and docs)."""
    return [f"/v1/{route}" for route in MODEL_ROUTES]


def _allowed_methods(route: list[bytes]) -> tuple[str, ...] | None:
    """The methods of the allow-listed route `route` matches, or None."""
    if not route or not all(_ROUTE_SEGMENT.fullmatch(segment) for segment in route):
        return None
    for pattern, methods in _PATTERNS:
        if len(pattern) == len(route) and all(
            p is None or p == s for p, s in zip(pattern, route, strict=True)
        ):
            return methods
    return None


def _compile(route: str) -> tuple[bytes | None, ...]:
    return tuple(None if s.startswith("{") else s.encode("ascii") for s in route.split("/"))


_PATTERNS = [(_compile(route), methods) for route, methods in MODEL_ROUTES.items()]


def _name(segment: bytes) -> str:
    """An episode id or agent name from its (checked) path segment."""
    return unquote_to_bytes(segment).decode("utf-8")
