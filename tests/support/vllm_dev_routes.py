"""vLLM 0.32's dev-mode weight routes, played by a small stdlib HTTP server on 127.0.0.1.

Bodies and answers as read from vLLM's `entrypoints/rl/online/api_router.py` (`/pause`,
`/resume`, `/update_weight_version`, `/weight_info`) and `entrypoints/serve/dev/rpc/api_router.py`
(`/collective_rpc`); every request is recorded. The real reload is checked end to end in
tests/e2e/test_rl_weights_real.py.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class DevRoutes:
    """vLLM's weight routes in dev mode: records each request, keeps the version label."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.version = "default"
        self.paused = False
        self.rpc_answer: Any = {"results": [None]}
        self.rpc_status = 200
        handler = self._handler()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> DevRoutes:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reloads(self) -> list[str]:
        """The `weights_path` of every `reload_weights` received, in order."""
        return [
            body["kwargs"]["weights_path"]
            for method, path, body in self.requests
            if path == "/collective_rpc"
        ]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        routes = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                routes.requests.append(("GET", self.path, None))
                if self.path == "/weight_info":
                    self._answer(200, {"weight_version": routes.version})
                else:
                    self._answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body: Any = json.loads(self.rfile.read(length)) if length else {}
                routes.requests.append(("POST", self.path, body or None))
                if self.path.startswith("/pause"):
                    routes.paused = True
                    self._answer(200, {"status": "paused"})
                elif self.path == "/resume":
                    routes.paused = False
                    self._answer(200, {"status": "resumed"})
                elif self.path == "/collective_rpc":
                    self._answer(routes.rpc_status, routes.rpc_answer)
                elif self.path == "/update_weight_version":
                    routes.version = body["new_version"]
                    self._answer(200, {"success": True, "new_version": routes.version})
                else:
                    self._answer(404, {"detail": "Not Found"})

        return Handler
