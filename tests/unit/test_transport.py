"""The capture transports inside both HTTP libraries the openai SDK has used: httpx (openai < 3)
and httpx2, sync and async, JSON and SSE, compressed or not.

openai 3 builds on httpx2, so the rest of the suite drives httpx2 through the SDK. An openai 2.x
client holds an `httpx.Client` instead; `collector.wrap` only needs its `_client` and `base_url`,
so this drives the same transport code through a stand-in with those two attributes, sending the
JSON the SDK sends, against replayed real vLLM 0.32 output.
"""

from __future__ import annotations

import json
import types
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest

import tito_agents as tito
from tests.support.capture_replay import BASE_URL, Capture, load_capture

LIBRARIES = [httpx, httpx2]


def server(module: types.ModuleType, cap: Capture, seen: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Sync and async mock transports of `module` answering `cap` (SSE in several chunks)."""
    headers = {"content-type": "text/event-stream" if cap.is_stream else "application/json"}
    pieces = cap.events() if cap.is_stream else [cap.body[:100], cap.body[100:]]

    def handler(request: Any) -> Any:
        seen.append(json.loads(request.content))
        return module.Response(cap.status, headers=headers, content=iter(pieces))

    async def ahandler(request: Any) -> Any:
        seen.append(json.loads(request.content))

        async def chunks() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return module.Response(cap.status, headers=headers, content=chunks())

    return module.MockTransport(handler), module.MockTransport(ahandler)


class SdkStandIn:
    """What `collector.wrap` reads off an openai client: its HTTP client and base URL."""

    def __init__(self, http_client: Any) -> None:
        self._client = http_client
        self.base_url = BASE_URL


def request_of(cap: Capture) -> dict[str, Any]:
    return {k: v for k, v in cap.request.items() if k not in ("return_token_ids", "logprobs")}


def read_sync(response: Any) -> bytes:
    return b"".join(response.iter_bytes())


def check(
    cap: Capture, response: Any, caller_body: bytes, seen: list[dict[str, Any]], ep: tito.Episode
) -> None:
    assert seen[0]["return_token_ids"] is True  # added for the vLLM host
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE
    if cap.is_stream:
        assert caller_body == cap.body  # streams pass through unchanged
        return
    # the server sent it in chunks; the caller gets it whole, framed by its length
    assert "transfer-encoding" not in response.headers
    assert response.headers["content-length"] == str(len(caller_body))
    want = cap.json()
    assert call.prompt_ids.tolist() == want["prompt_token_ids"]
    assert call.sampled_ids.tolist() == want["choices"][0]["token_ids"]
    got = json.loads(caller_body)
    assert got["prompt_token_ids"] is None and got["choices"][0]["token_ids"] is None
    want["prompt_token_ids"] = want["choices"][0]["token_ids"] = None
    assert got == want  # everything else as the server sent it


@pytest.mark.parametrize("name", ["chat_ns", "chat_stream"])
@pytest.mark.parametrize("module", LIBRARIES, ids=lambda m: m.__name__)
def test_sync_client_of_either_library_is_captured(module: types.ModuleType, name: str) -> None:
    cap = load_capture(name)
    seen: list[dict[str, Any]] = []
    transport, _ = server(module, cap, seen)
    collector = tito.Collector()
    client = collector.wrap(SdkStandIn(module.Client(transport=transport)))._client
    url = f"{BASE_URL}/chat/completions"
    with collector.episode() as ep, client.stream("POST", url, json=request_of(cap)) as response:
        body = read_sync(response)
    check(cap, response, body, seen, ep)


@pytest.mark.parametrize("name", ["chat_ns", "chat_stream"])
@pytest.mark.parametrize("module", LIBRARIES, ids=lambda m: m.__name__)
async def test_async_client_of_either_library_is_captured(
    module: types.ModuleType, name: str
) -> None:
    cap = load_capture(name)
    seen: list[dict[str, Any]] = []
    _, transport = server(module, cap, seen)
    collector = tito.Collector()
    client = collector.wrap(SdkStandIn(module.AsyncClient(transport=transport)))._client
    async with collector.episode() as ep:
        response = await client.post(f"{BASE_URL}/chat/completions", json=request_of(cap))
        body = response.content
    check(cap, response, body, seen, ep)
    await client.aclose()


@pytest.mark.parametrize("module", LIBRARIES, ids=lambda m: m.__name__)
def test_other_hosts_are_untouched_in_either_library(module: types.ModuleType) -> None:
    """A request to a host not marked as vLLM is sent as it was: no vLLM-only field."""
    cap = load_capture("chat_ns")
    seen: list[dict[str, Any]] = []
    transport, _ = server(module, cap, seen)
    collector = tito.Collector()
    client = collector.wrap(SdkStandIn(module.Client(transport=transport)))._client
    with collector.episode() as ep:
        client.post("http://other.test/v1/chat/completions", json=request_of(cap))
    assert "return_token_ids" not in seen[0]
    assert ep.calls == []


@pytest.mark.parametrize("module_name", ["httpx", "httpx2"])
def test_zstd_streams_are_read_where_the_http_library_can_decode_them(module_name: str) -> None:
    """zstd: httpx decodes it (with `zstandard`), so capture reads the stream through the same
    decoder and records it complete; httpx2 has no zstd decoder, so the call is recorded unusable
    saying which encoding, never as a stream that "ended without [DONE]"."""
    import importlib

    from tests.support.capture_replay import MSG, streamed_ids

    zstandard = pytest.importorskip("zstandard")  # here through langsmith; httpx needs it too

    module = importlib.import_module(module_name)
    cap = load_capture("chat_stream")
    prompt, sampled = streamed_ids(cap)
    compressor = zstandard.ZstdCompressor().compressobj()
    pieces = [
        compressor.compress(e) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        for e in cap.events()
    ]
    pieces.append(compressor.flush())
    headers = {"content-type": "text/event-stream", "content-encoding": "zstd"}
    transport = module.MockTransport(
        lambda request: module.Response(200, headers=headers, content=iter(pieces))
    )
    collector = tito.Collector(capture_logprobs=False, errors="count")
    client = collector.wrap(SdkStandIn(module.Client(transport=transport)))._client
    body = {"model": "m", "messages": MSG, "stream": True}
    url = "http://vllm.test:8000/v1/chat/completions"
    with collector.episode() as ep, client.stream("POST", url, json=body) as response:
        received = b"".join(response.iter_bytes())
    (call,) = ep.calls
    if "zstd" in module._decoders.SUPPORTED_DECODERS:
        assert received == cap.body  # the caller's client decoded its own copy
        assert call.status is tito.CallStatus.COMPLETE
        assert (call.prompt_ids.tolist(), call.sampled_ids.tolist()) == (prompt, sampled)
    else:
        assert call.status is tito.CallStatus.UNUSABLE
        assert isinstance(call.error, tito.errors.MalformedResponseError)
        assert "'zstd'" in str(call.error)
