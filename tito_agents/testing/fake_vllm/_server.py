"""`FakeVLLMServer`: the fake vLLM over real HTTP/1.1, on its own event loop in a background thread.

Built on asyncio streams only. It keeps connections alive between requests, sends JSON with
`content-length` and SSE with `transfer-encoding: chunked` (one chunk per event, written as soon as
the event is produced), and survives clients that go away mid-stream. A stream cut on purpose
(`cut_stream_after`) closes the connection without the terminating chunk, which clients see as an
incomplete body.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from types import TracebackType
from typing import Any

from tito_agents.testing.fake_vllm._core import (
    FakeConfig,
    FakeResponse,
    FakeStats,
    FakeVLLM,
    Faults,
    StreamCut,
)

__all__ = ["FakeVLLMServer"]

_MAX_HEAD = 1 << 20
_STOP_TIMEOUT = 10.0


class _BadRequest(Exception):
    """The bytes on the wire are not an HTTP/1.1 request we can parse."""


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


class FakeVLLMServer:
    """Serve a `FakeVLLM` on `host:port` (port 0 picks a free port) until `stop()`.

    Use as `with FakeVLLMServer(cfg) as srv:` or `async with ...`; `srv.base_url` is the OpenAI
    base URL (`http://127.0.0.1:PORT/v1`). `faults`, `stats` and `fail_next` are the core's, so
    tests can change switches and read counters while the server runs. `start` and `stop` are
    idempotent and thread-safe enough for test use; `stop` waits for the thread to end.
    """

    def __init__(
        self,
        config: FakeConfig | FakeVLLM | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        backlog: int = 4096,
    ) -> None:
        self.fake = config if isinstance(config, FakeVLLM) else FakeVLLM(config)
        self.host = host
        self.port = port
        self._backlog = backlog
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._startup_error: BaseException | None = None

    # -- public surface ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The server root, for `/tokenize`, `/detokenize` and `/health`."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL."""
        return f"{self.url}/v1"

    @property
    def faults(self) -> Faults:
        return self.fake.faults

    @property
    def stats(self) -> FakeStats:
        return self.fake.stats

    def fail_next(
        self, count: int = 1, *, status: int = 503, retry_after_ms: int | None = None
    ) -> None:
        self.fake.fail_next(count, status=status, retry_after_ms=retry_after_ms)

    def start(self) -> FakeVLLMServer:
        if self._thread is not None:
            return self
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="fake-vllm", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise self._startup_error
        return self

    def stop(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_STOP_TIMEOUT)
        self._thread = None

    def __enter__(self) -> FakeVLLMServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> FakeVLLMServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- event loop thread ---------------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(
                    self._on_connection,
                    self.host,
                    self.port,
                    backlog=self._backlog,
                    limit=_MAX_HEAD,
                )
            )
            self.port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:  # reported to the starting thread
            self._startup_error = exc
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.close()

    async def _shutdown(self) -> None:
        """Close the listener, then end every task on the loop before it closes.

        Every task, not a snapshot of `_connections`: a connection accepted just before the close
        has a task that has not started yet (it registers itself when it runs), and a loop closed
        under a pending task prints "Task was destroyed but it is pending!" to stderr. Only
        registered connections are cancelled (a task cancelled before it starts ends cancelled,
        which asyncio.streams reports); unstarted ones get a turn to start, then are cancelled.
        """
        if self._server is not None:
            self._server.close()
        current = asyncio.current_task()
        deadline = time.monotonic() + _STOP_TIMEOUT
        while others := [task for task in asyncio.all_tasks() if task is not current]:
            for task in others:
                if task in self._connections or time.monotonic() > deadline:
                    task.cancel()
            await asyncio.wait(others, timeout=0.05)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.stats.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            _BadRequest,
            asyncio.LimitOverrunError,
        ):
            pass
        except asyncio.CancelledError:
            # `stop()` cancels open keep-alive connections. The task ends normally instead of
            # cancelled: Python 3.11's asyncio.streams calls `task.exception()` on the handler
            # task when it is done, which raises (and prints a traceback) for a cancelled task.
            pass
        finally:
            writer.close()
            # Still registered while it waits for the close, so `_shutdown` waits for it too; a
            # cancel landing here only cuts that wait short.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer requests on one connection until the client or a response ends it."""
        while True:
            request = await _read_request(reader)
            if request is None:
                return
            response = self.fake.handle(
                request.method, request.target, request.body, request.headers
            )
            if response.delay_s:
                await asyncio.sleep(response.delay_s)
            finished = await self._respond(writer, request, response)
            if not (finished and request.keep_alive):
                return

    async def _respond(
        self, writer: asyncio.StreamWriter, request: _Request, response: FakeResponse
    ) -> bool:
        """Write one response; False when the connection must be closed afterwards."""
        headers = [("date", formatdate(usegmt=True)), ("server", "uvicorn"), *response.headers]
        if not request.keep_alive:
            headers.append(("connection", "close"))
        if response.stream is None:
            headers.append(("content-length", str(len(response.body))))
            writer.write(_head(response.status, headers) + response.body)
            await writer.drain()
            return True
        headers.append(("transfer-encoding", "chunked"))
        writer.write(_head(response.status, headers))
        stream = response.stream
        try:
            async for event in stream:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
        except StreamCut:
            self.stats.cut_streams += 1
            writer.transport.abort()
            return False
        except ConnectionError:
            self.stats.disconnects += 1
            return False
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on the connection, or None when the client closed it cleanly."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadRequest("connection closed inside a request head") from exc
        return None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError as exc:
        raise _BadRequest(f"bad request line {lines[0]!r}") from exc
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return _Request(method, target, version, headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
