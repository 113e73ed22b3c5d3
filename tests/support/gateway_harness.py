"""Test helpers for the capture gateway: a gateway served by uvicorn on a free loopback port,
in a background thread (`ServedGateway`), or as the `tito-agents serve` command (`serve_cli`);
an upstream that records every path it receives and holds requests on demand
(`RecordingUpstream`); a raw HTTP/1.1 request, sent byte for byte (`raw_request`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

import tito_agents as tito
from tito_agents.gateway import Gateway, GatewayConfig
from tito_agents.sinks.harness import free_port
from tito_agents.testing.fake_vllm import FakeVLLM

TOKEN = "control-secret-for-tests"


class ServedGateway:
    """`Gateway(collector, config)` on 127.0.0.1 in a thread, until `stop()`."""

    def __init__(self, collector: tito.Collector, upstream: str, **config: Any) -> None:
        config.setdefault("control_token", TOKEN)
        self.gateway = Gateway(collector, GatewayConfig(upstream=upstream, **config))
        self.collector = collector
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.gateway.app(),
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                access_log=False,
                lifespan="on",
            )
        )
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()))
        self._controls: list[Control] = []

    def start(self) -> ServedGateway:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        for control in self._controls:
            control.http.close()
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> ServedGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def control(self, token: str = TOKEN) -> Control:
        control = Control(self.url, token)
        self._controls.append(control)
        return control


class Control:
    """The control API as a rollout driver calls it (with the token)."""

    def __init__(self, url: str, token: str = TOKEN) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60
        )

    def open(self, episode_id: str | None = None, **body: Any) -> dict[str, Any]:
        if episode_id is not None:
            body["episode_id"] = episode_id
        response = self.http.post("/control/episodes", json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())

    def close(self, episode_id: str, **body: Any) -> dict[str, Any]:
        response = self.http.post(f"/control/episodes/{episode_id}/close", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def report(self, episode_id: str) -> httpx.Response:
        return self.http.get(f"/control/episodes/{episode_id}")

    def reward(self, episode_id: str, reward: float, call: str | None = None) -> httpx.Response:
        return self.http.post(
            f"/control/episodes/{episode_id}/reward", json={"reward": reward, "call": call}
        )


@contextlib.contextmanager
def serve_cli(
    upstream: str, sink: Path | str, state: Path, *extra: str, port: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`tito-agents serve` as a subprocess; yields (process, base url). Stopped with SIGTERM."""
    port = port or free_port()
    env = {**os.environ, "TITO_GATEWAY_TOKEN": TOKEN}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tito_agents.cli",
            "serve",
            "--upstream",
            upstream,
            "--sink",
            str(sink),
            "--state",
            str(state),
            "--port",
            str(port),
            "--log-level",
            "warning",
            *extra,
        ],
        env=env,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited: {process.stderr.read().decode()}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("serve did not start")
            time.sleep(0.1)
        yield process, url
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()


class RecordingUpstream:
    """The fake vLLM's pure core (`FakeVLLM.handle`) served by uvicorn on a free loopback port.

    `requests` lists every request it received as (method, raw target: path and query as sent),
    so a test can assert what reached the upstream. `hold(n)` makes the next `n` requests wait
    unanswered until their client goes away (`outcomes` gets "dropped": the request was
    cancelled, as vLLM aborts a request whose connection closes) or until `release()` (they
    are answered, `outcomes` gets "answered"); `arrived` is set when a held request is waiting.
    No timing: a held request ends only on one of those two events.
    """

    def __init__(self, fake: FakeVLLM | None = None) -> None:
        self.fake = fake or FakeVLLM()
        self.requests: list[tuple[str, bytes]] = []
        self.outcomes: list[str] = []
        self.arrived = threading.Event()
        self._to_hold = 0
        self._lock = threading.Lock()
        self._released: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(
            uvicorn.Config(
                self, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
        )
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()))

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def hold(self, count: int = 1) -> None:
        with self._lock:
            self._to_hold = count
        self.arrived.clear()
        if self._loop is not None and self._released is not None:
            asyncio.run_coroutine_threadsafe(_clear(self._released), self._loop).result(30)

    def release(self) -> None:
        """Answer every held request (those whose client went away were dropped already)."""
        if self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)

    def paths(self) -> list[bytes]:
        return [target.split(b"?")[0] for _, target in self.requests]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        if self._released is None:
            self._loop, self._released = asyncio.get_running_loop(), asyncio.Event()
        query = scope.get("query_string", b"")
        target = scope["raw_path"] + (b"?" + query if query else b"")
        with self._lock:
            self.requests.append((scope["method"], target))
            held, self._to_hold = self._to_hold > 0, max(self._to_hold - 1, 0)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if held and not await self._wait_release(receive):
            with self._lock:
                self.outcomes.append("dropped")
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        response = self.fake.handle(scope["method"], scope["path"], body, headers)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(k.encode(), v.encode()) for k, v in response.headers],
            }
        )
        if response.stream is None:
            await send({"type": "http.response.body", "body": response.body})
        else:
            async for event in response.stream:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        if held:
            with self._lock:
                self.outcomes.append("answered")

    async def _wait_release(self, receive: Any) -> bool:
        """True once released, False when the client went away first."""
        assert self._released is not None
        self.arrived.set()
        gone = asyncio.ensure_future(_until_disconnect(receive))
        released = asyncio.ensure_future(self._released.wait())
        done, pending = await asyncio.wait({gone, released}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return released in done and gone not in done

    def start(self) -> RecordingUpstream:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the upstream did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.release()
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> RecordingUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _clear(event: asyncio.Event) -> None:
    event.clear()


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def raw_request(
    port: int, request_line: bytes, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """Send one HTTP/1.1 request exactly as given (`b"POST /v1/../x HTTP/1.1"`: no client
    library normalizes its target) on a new connection; returns (status, headers, body)."""
    head = [request_line, b"Host: 127.0.0.1", b"Connection: close"]
    head += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
    if body or request_line.startswith((b"POST", b"PUT")):
        head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, payload = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if fields.get("transfer-encoding") == "chunked":
        payload = _unchunk(payload)
    return status, fields, payload


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, data = out + data[:size], data[size + 2 :]
    return out


def vllm_error(body: bytes, status: int) -> dict[str, Any]:
    """The error of a vLLM-shaped error body (asserting its shape)."""
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] == status and isinstance(error["message"], str) and error["message"]
    return dict(error)


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    """Wait until `condition()` holds (a bound on a hang, not a timed assertion)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


def echo_responder(view: object) -> str:
    """Answers with the first user message, so a sample shows which episode asked for it."""
    messages = getattr(view, "messages", ())
    text = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "ok")
    return f"You said: {text}"


NODE_DIR = Path(__file__).resolve().parents[1] / "node"


def node_client() -> Path:
    """The client script, its npm dependencies installed from the lock file on first use."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed (Debian package nodejs)")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("npm is not installed, so the openai package cannot be installed")
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
            timeout=600,
        )
    return NODE_DIR / "gateway_client.mjs"


def run_node(base_url: str, model: str) -> dict[str, dict[str, object]]:
    out = subprocess.run(
        ["node", str(node_client()), base_url, model],
        capture_output=True,
        check=True,
        timeout=120,
    )
    return dict(json.loads(out.stdout))
