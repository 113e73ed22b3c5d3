"""The I/O steps of the capture flow, and the HTTP messages it builds.

A flow (`flow.request_flow`, and the Messages steps in `messages/flow.py`) is a generator that
yields these steps and is sent their results; the runners in `transport` perform them (sync or
async). The helpers read and build the HTTP library's requests and responses, given the library
as `module` (httpx or httpx2; `tito_agents._http`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any


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


# ---- requests and responses (the HTTP library's own classes, given as `module`) ----


def body_kind(response: Any) -> tuple[bool, bool]:
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


def already_read(response: Any) -> bytes | None:
    """The decoded body of a response an inner transport built from bytes (`Response(content=...)`
    reads it at once, and its stream may not be readable a second time), else None."""
    content = getattr(response, "_content", None)
    return content if isinstance(content, bytes) else None


REPLACED_RESPONSE_HEADERS = (b"content-length", b"content-encoding", b"transfer-encoding")


def with_body(module: Any, response: Any, body: bytes, status: int | None = None) -> Any:
    """`response` carrying `body` (decoded), already read: the client's own read of it is then a
    no-op instead of a second pass through httpx's decoder and chunker generators (measured:
    about 35 us per call, more than all of capture's parsing). Raw header pairs, as in
    `flow._rebuild`; `body` is whole and decoded, so it has a length and neither a content nor a
    transfer encoding."""
    headers = [
        (k, v) for k, v in response.headers.raw if k.lower() not in REPLACED_RESPONSE_HEADERS
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


def api_root(request: Any) -> str:
    """The API path of `request` without its endpoint: "/v1" for ".../v1/chat/completions"."""
    path: str = request.url.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions", "/responses", "/messages"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


def tokenize_path(root: str) -> str:
    """The `/tokenize` path of the server whose API root (`api_root`) is `root`: vLLM serves it at
    its root, not under /v1."""
    return f"{root.removesuffix('/v1')}/tokenize"
