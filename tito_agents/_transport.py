"""Capture transports for the HTTP library inside the openai client (httpx, or httpx2 for openai >= 3).

This is the only module that touches an httpx-family library. The two libraries share one transport
interface, so the classes are built once per library by `transport_classes(module)`. Each transport
holds the real inner transport and adds one concern: rewriting captured requests and teeing their
responses into the `CaptureCore`. Sync and async classes differ only in how they do I/O.
"""

from __future__ import annotations

import functools
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tito_agents._capture import CaptureCore, PendingCall, StreamTee


def _is_event_stream(response: Any) -> bool:
    return str(response.headers.get("content-type", "")).startswith("text/event-stream")


def _rewrite(module: Any, core: CaptureCore, request: Any) -> tuple[Any, PendingCall | None]:
    """Return the request to send (rewritten when captured) and its pending record."""
    try:
        body = request.content
    except Exception:  # a streaming upload: not an OpenAI-style JSON request
        return request, None
    url = request.url
    decision = core.begin(request.method, url.host, url.port, url.path, body)
    if decision is None:
        return request, None
    new_body, pending = decision
    headers = request.headers.copy()
    headers["accept-encoding"] = "identity"  # the SSE tee reads raw bytes
    if new_body is None:
        new_body = body
    headers.pop("content-length", None)
    rebuilt = module.Request(
        request.method, url, headers=headers, content=new_body, extensions=request.extensions
    )
    return rebuilt, pending


@functools.cache
def transport_classes(module: types.ModuleType) -> tuple[type[Any], type[Any]]:
    """The (sync, async) capture transport classes for `module` (httpx or httpx2)."""

    class SyncTee(module.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, tee: StreamTee) -> None:
            self._inner = inner
            self._tee = tee

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self._inner:
                self._tee.feed(chunk)
                yield chunk
            self._tee.end()

        def close(self) -> None:
            self._tee.close()
            self._inner.close()

    class AsyncTee(module.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, tee: StreamTee) -> None:
            self._inner = inner
            self._tee = tee

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._inner:
                self._tee.feed(chunk)
                yield chunk
            self._tee.end()

        async def aclose(self) -> None:
            self._tee.close()
            await self._inner.aclose()

    class CaptureTransport(module.BaseTransport):  # type: ignore[name-defined,misc]
        """Wraps a sync transport; captures POSTs to vLLM-marked hosts."""

        def __init__(self, inner: Any, core: CaptureCore) -> None:
            self.inner = inner
            self.core = core

        def handle_request(self, request: Any) -> Any:
            request, pending = _rewrite(module, self.core, request)
            if pending is None:
                return self.inner.handle_request(request)
            try:
                response = self.inner.handle_request(request)
            except BaseException:
                self.core.discard(pending, None)
                raise
            if not 200 <= response.status_code < 300:
                self.core.discard(pending, response.status_code)
                return response
            if _is_event_stream(response):
                tee = self.core.open_stream(pending, response.status_code)
                return module.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=SyncTee(response.stream, tee),
                    extensions=response.extensions,
                )
            try:
                body = response.read()
            except BaseException:
                self.core.discard(pending, response.status_code)
                raise
            self.core.finish_body(pending, response.status_code, body)
            return response

        def close(self) -> None:
            self.inner.close()

    class AsyncCaptureTransport(module.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        """Wraps an async transport; captures POSTs to vLLM-marked hosts."""

        def __init__(self, inner: Any, core: CaptureCore) -> None:
            self.inner = inner
            self.core = core

        async def handle_async_request(self, request: Any) -> Any:
            request, pending = _rewrite(module, self.core, request)
            if pending is None:
                return await self.inner.handle_async_request(request)
            try:
                response = await self.inner.handle_async_request(request)
            except BaseException:
                self.core.discard(pending, None)
                raise
            if not 200 <= response.status_code < 300:
                self.core.discard(pending, response.status_code)
                return response
            if _is_event_stream(response):
                tee = self.core.open_stream(pending, response.status_code)
                return module.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=AsyncTee(response.stream, tee),
                    extensions=response.extensions,
                )
            try:
                body = await response.aread()
            except BaseException:
                self.core.discard(pending, response.status_code)
                raise
            self.core.finish_body(pending, response.status_code, body)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    return CaptureTransport, AsyncCaptureTransport


def http_module_of(http_client: Any) -> types.ModuleType:
    """The httpx-family module an HTTP client instance comes from (httpx or httpx2)."""
    import importlib

    for klass in type(http_client).__mro__:
        root = klass.__module__.split(".")[0]
        if root in ("httpx", "httpx2"):
            return importlib.import_module(root)
    raise TypeError(f"{type(http_client).__name__} is not an httpx or httpx2 client")


def install(http_client: Any, core: CaptureCore) -> None:
    """Wrap the transports of an existing httpx/httpx2 client in place (its proxies included).

    Re-installing replaces the core instead of stacking a second capture layer.
    """
    module = http_module_of(http_client)
    sync_cls, async_cls = transport_classes(module)
    is_async = isinstance(http_client, module.AsyncClient)
    cls = async_cls if is_async else sync_cls

    def wrap(transport: Any) -> Any:
        if transport is None:
            return None
        if isinstance(transport, cls):
            transport.core = core
            return transport
        return cls(transport, core)

    http_client._transport = wrap(http_client._transport)
    mounts = getattr(http_client, "_mounts", None)
    if mounts:
        http_client._mounts = {pattern: wrap(t) for pattern, t in mounts.items()}
