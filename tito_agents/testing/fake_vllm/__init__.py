"""A faithful fake vLLM 0.32 OpenAI-compatible server on the real SmolLM2 tokenizer, for tests.

`FakeVLLM` is the pure core: `handle(method, path, body, headers)` returns a `FakeResponse` without
any I/O, so it can be unit-tested directly. `mock_transport(fake)` puts it behind an in-process
httpx/httpx2 transport (no socket, no thread), for openai clients in tests:

    from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
    fake = FakeVLLM(FakeConfig(responder=lambda view: "Hello."))
    client = openai.OpenAI(base_url="http://vllm.test/v1", api_key="x",
                           http_client=openai.DefaultHttpxClient(transport=mock_transport(fake)))

`FakeVLLMServer` serves it over real HTTP/1.1 on 127.0.0.1 (keep-alive, chunked SSE, hundreds of
concurrent connections) from a background thread:

    from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
    with FakeVLLMServer(FakeConfig(tokenization="drift")) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")
        srv.faults.cut_stream_after = 3          # fault switches change at runtime
        srv.stats["/v1/chat/completions"]        # requests received per path

Generation is deterministic and scriptable (`FakeConfig.responder`); responses follow vLLM 0.32's
wire format byte for byte (key order, nulls, SSE framing), see docs/vllm-wire-format.md.
Fault switches (`Faults`) reproduce old servers and broken networks; each is off by default and can
also be set for one request with the header `x-fake-fault: name[=value][, ...]`.

This package's `__all__` is its whole public surface. Its modules are private (leading underscore)
and may change: `_core` (config, faults, `FakeVLLM.handle`), `_server` (HTTP), `_mock` (in-process
transport), `_engine` with `_chat`, `_completions` and `_responses` (the endpoints; the Responses
API renders and samples through the chat path, as vLLM does), `_requests` (request
validation), `_wire` (vLLM's JSON and SSE shapes), `_model`, `_responder`, `_codec`, `_logprobs`,
`_tools`, `_handoffs` and `_hash` (what the fake model says, and how it is tokenized and scored;
`handoff_responder` plays the agents of supervisor, swarm and triage graphs).

Run standalone (serves until killed): `python -m tito_agents.testing.fake_vllm --port 8765`.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from tito_agents.testing.fake_vllm._core import (
    FAULT_HEADER,
    FakeConfig,
    FakeResponse,
    FakeStats,
    FakeVLLM,
    Faults,
    StreamCut,
)
from tito_agents.testing.fake_vllm._handoffs import handoff_responder
from tito_agents.testing.fake_vllm._mock import Handler, mock_transport
from tito_agents.testing.fake_vllm._model import RequestView, Responder, Tokenization
from tito_agents.testing.fake_vllm._responder import default_responder, hermes_tool_call
from tito_agents.testing.fake_vllm._server import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

__all__ = [
    "FAULT_HEADER",
    "FakeConfig",
    "FakeResponse",
    "FakeStats",
    "FakeVLLM",
    "FakeVLLMServer",
    "Faults",
    "Handler",
    "RequestView",
    "Responder",
    "StreamCut",
    "Tokenization",
    "default_responder",
    "handoff_responder",
    "hermes_tool_call",
    "main",
    "mock_transport",
]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m tito_agents.testing.fake_vllm`: serve a fake vLLM until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m tito_agents.testing.fake_vllm",
        description="Serve a fake vLLM 0.32 (SmolLM2 tokenizer).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--model", default=MODEL_NAME)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before each response")
    parser.add_argument(
        "--token-latency-ms", type=float, default=0.0, help="delay before each SSE event"
    )
    parser.add_argument("--tokenization", choices=["canonical", "drift"], default="canonical")
    parser.add_argument("--drift-rate", type=float, default=0.25)
    args = parser.parse_args(argv)
    config = FakeConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        tokenization=args.tokenization,
        drift_rate=args.drift_rate,
        faults=Faults(latency_ms=args.latency_ms, token_latency_ms=args.token_latency_ms),
    )
    stop = threading.Event()
    # SIGINT and SIGTERM both stop it cleanly (exit 0). SIGINT is installed explicitly: a shell
    # starts background jobs with SIGINT ignored, and Python then installs no handler of its own.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with FakeVLLMServer(config, host=args.host, port=args.port) as server:
        print(f"fake vLLM 0.32 ({config.model}) serving at {server.base_url}", flush=True)
        while not stop.wait(0.5):
            pass
