"""A bare pass-through proxy on the gateway's stack (Starlette on uvicorn, the openai package's
httpx client, streams relayed with `aiter_raw`), for benchmarks/bench_gateway.py: what any
OpenAI-compatible proxy costs before capturing anything.

    python benchmarks/gateway_passthrough.py PORT UPSTREAM_ROOT
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

import openai
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_HOP = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length"}


def build_app(upstream: str) -> Starlette:
    client = openai.DefaultAsyncHttpxClient(
        follow_redirects=False,
        timeout=openai.Timeout(600, connect=60),  # as the benchmark's gateway
        limits=type(openai.DEFAULT_CONNECTION_LIMITS)(
            max_connections=1024, max_keepalive_connections=1024, keepalive_expiry=4.0
        ),
    )

    async def relay(response: Any) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    async def forward(request: Request) -> Response:
        headers = [(k, v) for k, v in request.scope["headers"] if k.lower() not in _HOP]
        upstream_request = client.build_request(
            request.method,
            upstream + request.url.path,
            headers=headers,
            content=await request.body(),
        )
        response = await client.send(upstream_request, stream=True)
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            streamed = StreamingResponse(relay(response), status_code=response.status_code)
            streamed.raw_headers = out
            return streamed
        body = b"".join([chunk async for chunk in relay(response)])
        whole = Response(body, status_code=response.status_code)
        whole.raw_headers = [*out, (b"content-length", b"%d" % len(body))]
        return whole

    return Starlette(routes=[Route("/v1/{path:path}", forward, methods=["GET", "POST"])])


if __name__ == "__main__":
    port, upstream = int(sys.argv[1]), sys.argv[2].rstrip("/")
    uvicorn.run(
        build_app(upstream), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )
