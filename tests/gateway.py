"""Test helpers for the capture gateway: a gateway served by uvicorn on a free loopback port,
in a background thread (`ServedGateway`), or as the `tito-agents serve` command (`serve_cli`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

import tito_agents as tito
from tito_agents.gateway import Gateway, GatewayConfig

TOKEN = "control-secret-for-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
