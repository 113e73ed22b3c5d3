"""`mock_transport`: the pure core as an in-process httpx/httpx2 transport (no socket, no thread).

Most tests want the fake's answers, not its HTTP server: a transport that calls `FakeVLLM.handle`
directly is faster, needs no port, and fails with a plain traceback. Hand-written ones drift apart
(one reads streams whole, another leaves latency out), so this is the one version, as close to
`FakeVLLMServer` as an in-process transport can be:

* a body arrives whole with its `content-length`; a stream arrives event by event, as the fake
  produces them, with `transfer-encoding: chunked` (what the server sends);
* `latency_ms` is waited before the response, `token_latency_ms` before each event;
* a stream cut on purpose (`cut_stream_after`) raises the HTTP library's `RemoteProtocolError`
  mid-body, as a connection closed without the terminating chunk does, and counts in
  `stats.cut_streams`; a stream the client closes before `data: [DONE]` counts in
  `stats.disconnects` (the server sends the rest without waiting for the reader, so a client
  that stops at `[DONE]` has not abandoned anything).

One transport object serves both sync and async clients (like the libraries' own
`MockTransport`). It is built for the HTTP library the installed openai SDK uses (httpx2 for
openai >= 3, httpx before), or the one named by `http=`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from tito_agents.testing.fake_vllm._core import FakeResponse, FakeStats, FakeVLLM, StreamCut
from tito_agents.testing.fake_vllm._wire import DONE

__all__ = ["Handler", "mock_transport"]

Handler = Callable[[str, str, bytes, Mapping[str, str]], FakeResponse]
"""What a transport calls per request: `(method, target, body, headers) -> FakeResponse`, the
signature of `FakeVLLM.handle`. Pass your own to alter requests or answers around the fake."""

T = TypeVar("T")
_CUT = "peer closed connection without sending complete message body (incomplete chunked read)"


def mock_transport(fake: FakeVLLM | Handler, *, http: types.ModuleType | None = None) -> Any:
    """An in-process transport answering every request with `fake` (a `FakeVLLM`, or a `Handler`).

        fake = FakeVLLM(FakeConfig(responder=lambda view: "Hello."))
        client = openai.OpenAI(
            base_url="http://vllm.test/v1", api_key="x",
            http_client=openai.DefaultHttpxClient(transport=mock_transport(fake)),
        )

    The same object works in `openai.DefaultAsyncHttpxClient(transport=...)`. The host in the base
    URL is never resolved. `http` is the `httpx` or `httpx2` module; by default the one the
    installed openai SDK builds its clients on.
    """
    module = http if http is not None else openai_http_module()
    if isinstance(fake, FakeVLLM):
        return _classes(module)[0](fake.handle, fake.stats)
    return _classes(module)[0](fake, None)


def openai_http_module() -> types.ModuleType:
    """`httpx2` or `httpx`: the module the installed openai SDK's default HTTP client comes from."""
    import openai

    for klass in openai.DefaultHttpxClient.__mro__:
        root = klass.__module__.split(".")[0]
        if root in ("httpx", "httpx2"):
            return importlib.import_module(root)
    raise RuntimeError("openai.DefaultHttpxClient is neither an httpx nor an httpx2 client")


_sync_lock = threading.Lock()
_sync_loop: asyncio.AbstractEventLoop | None = None


def _on_sync_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the event loop that produces the events of sync streams, and wait for it.

    The fake makes events on an event loop (token latency is `asyncio.sleep`) and a sync client has
    none. The loop cannot be one of the stream's own in the caller's thread: a sync client may be
    used where a loop already runs (an async test, an async framework calling sync code), and a
    second loop cannot run there. So one loop, on a daemon thread, serves every sync stream.
    """
    global _sync_loop
    with _sync_lock:
        if _sync_loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="fake-vllm-mock", daemon=True)
            thread.start()
            atexit.register(_stop_sync_loop, loop, thread)
            _sync_loop = loop
        loop = _sync_loop
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def _stop_sync_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    if not thread.is_alive():
        loop.close()


async def _next(events: AsyncIterator[bytes]) -> tuple[bool, bytes]:
    """(True, the next event) or (False, b"") at the end: `StopAsyncIteration` cannot cross a
    future."""
    try:
        return True, await anext(events)
    except StopAsyncIteration:
        return False, b""


@functools.cache
def _classes(module: types.ModuleType) -> tuple[type[Any], type[Any]]:
    """The (transport, stream) classes for `module`: they must subclass its own base classes, which
    is how its clients tell a sync stream from an async one."""

    class FakeStream(module.SyncByteStream, module.AsyncByteStream):  # type: ignore[name-defined,misc]
        """The SSE events of one response, readable once, from a sync or an async client."""

        def __init__(self, events: AsyncIterator[bytes], stats: FakeStats | None) -> None:
            self._events = events
            self._stats = stats
            self._started = self._ended = False

        def _cut(self, exc: StreamCut) -> BaseException:
            self._ended = True
            if self._stats is not None:
                self._stats.cut_streams += 1
            return module.RemoteProtocolError(_CUT)  # type: ignore[no-any-return]

        def __iter__(self) -> Iterator[bytes]:
            self._started = True
            while True:
                try:
                    more, event = _on_sync_loop(_next(self._events))
                except StreamCut as exc:
                    raise self._cut(exc) from exc
                if not more:
                    self._ended = True
                    return
                self._ended = event == DONE
                yield event

        async def __aiter__(self) -> AsyncIterator[bytes]:
            self._started = True
            try:
                async for event in self._events:
                    self._ended = event == DONE
                    yield event
            except StreamCut as exc:
                raise self._cut(exc) from exc
            self._ended = True

        def _abandoned(self) -> None:
            if not self._ended and self._stats is not None:
                self._stats.disconnects += 1
            self._ended = True

        def close(self) -> None:
            self._abandoned()
            closer = getattr(self._events, "aclose", None)
            if closer is not None and self._started:
                with contextlib.suppress(Exception):
                    _on_sync_loop(closer())

        async def aclose(self) -> None:
            self._abandoned()
            closer = getattr(self._events, "aclose", None)
            if closer is not None and self._started:
                with contextlib.suppress(Exception):
                    await closer()

    class FakeTransport(module.BaseTransport, module.AsyncBaseTransport):  # type: ignore[name-defined,misc]
        """Answers each request with the fake's handler; see `mock_transport`."""

        def __init__(self, handle: Handler, stats: FakeStats | None) -> None:
            self.handle = handle
            self.stats = stats

        def _answer(self, request: Any) -> tuple[FakeResponse, Any]:
            target = request.url.raw_path.decode("ascii")
            answer = self.handle(request.method, target, request.content, dict(request.headers))
            return answer, self._response(answer)

        def _response(self, answer: FakeResponse) -> Any:
            if answer.stream is None:  # `content=` adds the content-length the server sends
                return module.Response(answer.status, headers=answer.headers, content=answer.body)
            headers = [*answer.headers, ("transfer-encoding", "chunked")]
            stream = FakeStream(answer.stream, self.stats)
            return module.Response(answer.status, headers=headers, stream=stream)

        def handle_request(self, request: Any) -> Any:
            request.read()
            answer, response = self._answer(request)
            if answer.delay_s:
                time.sleep(answer.delay_s)
            return response

        async def handle_async_request(self, request: Any) -> Any:
            await request.aread()
            answer, response = self._answer(request)
            if answer.delay_s:
                await asyncio.sleep(answer.delay_s)
            return response

    return FakeTransport, FakeStream
