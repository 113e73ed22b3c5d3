"""Capture transports for the HTTP library inside the openai client (httpx, or httpx2 for openai >= 3).

This is the only module that touches an httpx-family library's transport interface. The two
libraries share it, so the classes are built once per library by `transport_classes(module)`. Each
transport holds the real inner transport and adds one concern: capturing POSTs to vLLM-marked
hosts. What happens to a request is `flow.request_flow`, written once without I/O; the sync and
async transports only run it, each performing the I/O steps its way.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio

from tito_agents._capture import CaptureCore, StreamTee
from tito_agents._capture.flow import request_flow, tokens_of
from tito_agents._capture.messages.relay import MessagesRelay
from tito_agents._capture.steps import Close, Fetch, Flow, ReadBody, Send, Step, Tokenize
from tito_agents._http import http_module_of

logger = logging.getLogger("tito_agents")


class _Driver:
    """Feeds a flow the result (or the exception) of each step's I/O and hands out its next step;
    the runners below only perform the steps."""

    __slots__ = ("_flow", "error", "response", "result")

    def __init__(self, flow: Flow) -> None:
        self._flow = flow
        self.result: Any = None
        self.error: BaseException | None = None
        self.response: Any = None

    def next_step(self) -> Step | None:
        """The next I/O step, or None once the flow returned its response (`response`)."""
        try:
            error, self.error = self.error, None
            step = self._flow.send(self.result) if error is None else self._flow.throw(error)
        except StopIteration as done:
            self.response = done.value
            return None
        self.result = None
        return step

    def __enter__(self) -> _Driver:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        """An exception of a step's I/O goes to the flow (at the step that asked for it)."""
        self.error = exc
        return exc is not None


def _run_sync(flow: Flow, inner: Any) -> Any:
    """Drive `flow` to its response, doing each step's I/O on the inner sync transport."""
    driver = _Driver(flow)
    while (step := driver.next_step()) is not None:
        with driver:
            driver.result = _do_sync(step, inner)
    return driver.response


def _do_sync(step: Step, inner: Any) -> Any:
    if isinstance(step, Send):
        return inner.handle_request(step.request)
    if isinstance(step, Tokenize):
        return [_tokenize_sync(inner, request) for request in step.requests]
    if isinstance(step, Fetch):
        return [_fetch_sync(inner, request) for request in step.requests]
    if isinstance(step, ReadBody):
        if step.decoded:
            return step.response.read()
        try:  # the raw chunks: httpx's decoding generators have nothing to do here
            return b"".join(step.response.stream)
        finally:
            step.response.close()
    step.response.close()
    return None


def _tokenize_sync(inner: Any, request: Any) -> list[int] | None:
    response = inner.handle_request(request)
    try:
        return tokens_of(response.status_code, response.read())
    finally:
        response.close()


def _fetch_sync(inner: Any, request: Any) -> tuple[int, bytes] | None:
    try:
        response = inner.handle_request(request)
        try:
            return response.status_code, response.read()
        finally:
            response.close()
    except Exception:  # a probe that fails decides nothing
        return None


async def _fetch_async(inner: Any, request: Any) -> tuple[int, bytes] | None:
    try:
        response = await inner.handle_async_request(request)
        try:
            return response.status_code, await response.aread()
        finally:
            await response.aclose()
    except Exception:  # a probe that fails decides nothing
        return None


async def _run_async(flow: Flow, inner: Any) -> Any:
    """`_run_sync` for the async transport: the same flow, awaited I/O."""
    driver = _Driver(flow)
    while (step := driver.next_step()) is not None:
        with driver:
            driver.result = await _do_async(step, inner)
    return driver.response


async def _do_async(step: Step, inner: Any) -> Any:
    if isinstance(step, Send):
        return await inner.handle_async_request(step.request)
    if isinstance(step, Tokenize):
        return await _tokenize_all(inner, step.requests)
    if isinstance(step, Fetch):  # a few small probes, once per server: one after the other
        return [await _fetch_async(inner, request) for request in step.requests]
    if isinstance(step, ReadBody):
        if step.decoded:
            return await step.response.aread()
        try:
            return b"".join([chunk async for chunk in step.response.stream])
        finally:
            await step.response.aclose()
    assert isinstance(step, Close)
    await step.response.aclose()
    return None


async def _tokenize_all(inner: Any, requests: list[Any]) -> list[list[int] | None]:
    """The renders of one plan step do not depend on each other: ask them all at once (anyio, so
    trio-run clients work too)."""
    results: list[list[int] | None] = [None] * len(requests)

    async def one(i: int) -> None:
        response = await inner.handle_async_request(requests[i])
        try:
            results[i] = tokens_of(response.status_code, await response.aread())
        finally:
            await response.aclose()

    if len(requests) == 1:
        await one(0)
        return results
    async with anyio.create_task_group() as group:
        for i in range(len(requests)):
            group.start_soon(one, i)
    return results


@functools.cache
def transport_classes(module: types.ModuleType) -> tuple[type[Any], type[Any]]:
    """The (sync, async) capture transport classes for `module` (httpx or httpx2)."""

    class SyncTee(module.SyncByteStream):  # type: ignore[name-defined,misc]
        """The response stream handed to the caller; each chunk also feeds the tee. With a
        `relay` (Messages calls), the caller gets what the relay makes of each chunk instead."""

        def __init__(self, inner: Any, tee: StreamTee, relay: MessagesRelay | None = None) -> None:
            self._inner = inner
            self._tee = tee
            self._relay = relay

        def __iter__(self) -> Iterator[bytes]:
            relay = self._relay
            for chunk in self._inner:
                self._tee.feed(chunk)
                if relay is None:
                    yield chunk
                elif out := relay.feed(chunk):
                    yield out
            self._tee.end()
            if relay is not None and (out := relay.end()):
                yield out

        def close(self) -> None:
            try:
                self._tee.close()  # may raise the typed error under the strict policy
            finally:
                self._inner.close()

    class AsyncTee(module.AsyncByteStream):  # type: ignore[name-defined,misc]
        """`SyncTee` for async streams."""

        def __init__(self, inner: Any, tee: StreamTee, relay: MessagesRelay | None = None) -> None:
            self._inner = inner
            self._tee = tee
            self._relay = relay

        async def __aiter__(self) -> AsyncIterator[bytes]:
            relay = self._relay
            async for chunk in self._inner:
                self._tee.feed(chunk)
                if relay is None:
                    yield chunk
                elif out := relay.feed(chunk):
                    yield out
            self._tee.end()
            if relay is not None and (out := relay.end()):
                yield out

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
            return _run_sync(request_flow(module, self.core, request, SyncTee), self.inner)

        def close(self) -> None:
            self.inner.close()

    class AsyncCaptureTransport(module.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        """Wraps an async transport; captures POSTs to vLLM-marked hosts."""

        def __init__(self, inner: Any, core: CaptureCore) -> None:
            self.inner = inner
            self.core = core

        async def handle_async_request(self, request: Any) -> Any:
            flow = request_flow(module, self.core, request, AsyncTee)
            return await _run_async(flow, self.inner)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return CaptureTransport, AsyncCaptureTransport


def install(http_client: Any, core: CaptureCore) -> None:
    """Wrap the transports of an existing httpx/httpx2 client in place (its proxies included).

    Re-installing replaces the core instead of stacking a second capture layer. A client captured
    by one collector at a time: when another collector's core is replaced, that is said (its
    episodes would otherwise just find no calls).
    """
    module = http_module_of(http_client)
    sync_cls, async_cls = transport_classes(module)
    is_async = isinstance(http_client, module.AsyncClient)
    cls = async_cls if is_async else sync_cls

    def wrap(transport: Any) -> Any:
        if transport is None:
            return None
        if isinstance(transport, cls):
            if transport.core.settings is not core.settings:
                logger.warning(
                    "this HTTP client was wrapped by another collector: its calls are captured by "
                    "the collector that wrapped it last only (give each collector a client of its "
                    "own; `client.copy()` shares the HTTP client, so create a new one)"
                )
            transport.core = core
            return transport
        return cls(transport, core)

    http_client._transport = wrap(http_client._transport)
    mounts = getattr(http_client, "_mounts", None)
    if mounts:
        http_client._mounts = {pattern: wrap(t) for pattern, t in mounts.items()}
