"""Capture transports for the HTTP library inside the openai client (httpx, or httpx2 for openai >= 3).

This is the only module that touches an httpx-family library. The two libraries share one transport
interface, so the classes are built once per library by `transport_classes(module)`. Each transport
holds the real inner transport and adds one concern: rewriting captured requests and teeing their
responses into the `CaptureCore`. Sync and async classes differ only in how they do I/O.
"""

from __future__ import annotations

import functools
import logging
import time
import types
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import anyio
import orjson

from tito_agents._capture import CaptureCore, PendingCall, StreamTee

logger = logging.getLogger("tito_agents")


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
    return (body if new_body is None else new_body), pending


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


def _tokenize_request(module: Any, request: Any, payload: dict[str, Any]) -> Any:
    """A `POST /tokenize` to the server of `request` (vLLM serves it at the root, not under /v1)."""
    path = request.url.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    path = path.removesuffix("/v1")
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    return module.Request(
        "POST",
        request.url.copy_with(path=f"{path}/tokenize", query=None),
        headers=headers,
        content=orjson.dumps(payload),
        extensions=request.extensions,
    )


def _tokens(status: int, body: bytes) -> list[int] | None:
    if status != 200:
        return None
    try:
        tokens = orjson.loads(body).get("tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return tokens if isinstance(tokens, list) else None


def _plan_failed(pending: PendingCall) -> None:
    logger.warning(
        "token-in session planning failed; the call is rendered by the server", exc_info=True
    )


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
            try:
                self._tee.close()  # may raise the typed error under the strict policy
            finally:
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
            try:
                self._tee.close()
            finally:
                await self._inner.aclose()

    class CaptureTransport(module.BaseTransport):  # type: ignore[name-defined,misc]
        """Wraps a sync transport; captures POSTs to vLLM-marked hosts."""

        def __init__(self, inner: Any, core: CaptureCore) -> None:
            self.inner = inner
            self.core = core

        def handle_request(self, request: Any) -> Any:
            decided = _decide(self.core, request)
            if decided is None:
                return self.inner.handle_request(request)
            body, pending = decided
            if pending.plan is not None:
                body = self._run_plan(request, pending, body)
            request = _rebuild(module, request, body)
            try:
                response = self.inner.handle_request(request)
            except BaseException:
                self.core.discard(pending, None)
                raise
            if not 200 <= response.status_code < 300:
                self.core.discard(pending, response.status_code)
                return response
            stream, encoded = _body_kind(response)
            decoders, unreadable = _content_decoders(module, response) if encoded else (None, None)
            if stream:  # the caller's client decodes its own copy, as without capture
                tee = self.core.open_stream(
                    pending, response.status_code, decompressor=decoders, unreadable=unreadable
                )
                return module.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=SyncTee(response.stream, tee),
                    extensions=response.extensions,
                )
            if unreadable is not None:  # recorded; the caller gets the response as it came
                try:
                    self.core.refuse_body(pending, response.status_code, unreadable)
                except BaseException:  # the strict policy fails the call
                    response.close()
                    raise
                return response
            try:
                already = _already_read(response)
                if already is not None:
                    body = already
                elif encoded:  # a server that ignored `accept-encoding: identity`
                    body = response.read()
                else:  # the raw chunks: httpx's decoding generators have nothing to do here
                    try:
                        body = b"".join(response.stream)
                    finally:
                        response.close()
            except BaseException:
                self.core.discard(pending, response.status_code)
                raise
            caller_body = self.core.finish_body(pending, response.status_code, body)
            return _with_body(module, response, body if caller_body is None else caller_body)

        def _run_plan(self, request: Any, pending: PendingCall, body: bytes) -> bytes:
            """Drive a token-in session plan, answering its /tokenize asks over the inner transport."""
            plan, decision, started = pending.plan, None, time.perf_counter()
            assert plan is not None
            try:
                asks = next(plan)
                while True:
                    results = []
                    for ask in asks:
                        response = self.inner.handle_request(
                            _tokenize_request(module, request, ask)
                        )
                        try:
                            results.append(_tokens(response.status_code, response.read()))
                        finally:
                            response.close()
                    asks = plan.send(results)
            except StopIteration as stop:
                decision = stop.value
            except Exception:
                _plan_failed(pending)
            body = self.core.apply_decision(pending, decision, body) or body
            pending.session_ms = (time.perf_counter() - started) * 1000
            return body

        def close(self) -> None:
            self.inner.close()

    class AsyncCaptureTransport(module.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        """Wraps an async transport; captures POSTs to vLLM-marked hosts."""

        def __init__(self, inner: Any, core: CaptureCore) -> None:
            self.inner = inner
            self.core = core

        async def handle_async_request(self, request: Any) -> Any:
            decided = _decide(self.core, request)
            if decided is None:
                return await self.inner.handle_async_request(request)
            body, pending = decided
            if pending.plan is not None:
                body = await self._run_plan(request, pending, body)
            request = _rebuild(module, request, body)
            try:
                response = await self.inner.handle_async_request(request)
            except BaseException:
                self.core.discard(pending, None)
                raise
            if not 200 <= response.status_code < 300:
                self.core.discard(pending, response.status_code)
                return response
            stream, encoded = _body_kind(response)
            decoders, unreadable = _content_decoders(module, response) if encoded else (None, None)
            if stream:  # the caller's client decodes its own copy, as without capture
                tee = self.core.open_stream(
                    pending, response.status_code, decompressor=decoders, unreadable=unreadable
                )
                return module.Response(
                    response.status_code,
                    headers=response.headers,
                    stream=AsyncTee(response.stream, tee),
                    extensions=response.extensions,
                )
            if unreadable is not None:  # recorded; the caller gets the response as it came
                try:
                    self.core.refuse_body(pending, response.status_code, unreadable)
                except BaseException:  # the strict policy fails the call
                    await response.aclose()
                    raise
                return response
            try:
                already = _already_read(response)
                if already is not None:
                    body = already
                elif encoded:  # a server that ignored `accept-encoding: identity`
                    body = await response.aread()
                else:  # the raw chunks (see the sync twin)
                    try:
                        body = b"".join([chunk async for chunk in response.stream])
                    finally:
                        await response.aclose()
            except BaseException:
                self.core.discard(pending, response.status_code)
                raise
            caller_body = self.core.finish_body(pending, response.status_code, body)
            return _with_body(module, response, body if caller_body is None else caller_body)

        async def _run_plan(self, request: Any, pending: PendingCall, body: bytes) -> bytes:
            """Async twin of the sync `_run_plan` (same plan, same asks, awaited I/O)."""
            plan, decision, started = pending.plan, None, time.perf_counter()
            assert plan is not None
            try:
                asks = next(plan)
                while True:
                    asks = plan.send(await self._tokenize_all(request, asks))
            except StopIteration as stop:
                decision = stop.value
            except Exception:
                _plan_failed(pending)
            body = self.core.apply_decision(pending, decision, body) or body
            pending.session_ms = (time.perf_counter() - started) * 1000
            return body

        async def _tokenize_all(
            self, request: Any, asks: list[dict[str, Any]]
        ) -> list[list[int] | None]:
            """The renders of one plan step do not depend on each other: ask them all at once
            (anyio, so trio-run clients work too)."""
            if len(asks) == 1:
                return [await self._tokenize(request, asks[0])]
            results: list[list[int] | None] = [None] * len(asks)

            async def one(i: int) -> None:
                results[i] = await self._tokenize(request, asks[i])

            async with anyio.create_task_group() as group:
                for i in range(len(asks)):
                    group.start_soon(one, i)
            return results

        async def _tokenize(self, request: Any, ask: dict[str, Any]) -> list[int] | None:
            response = await self.inner.handle_async_request(
                _tokenize_request(module, request, ask)
            )
            try:
                return _tokens(response.status_code, await response.aread())
            finally:
                await response.aclose()

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
