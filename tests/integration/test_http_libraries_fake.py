"""`Collector.http_client(library=...)`: a plain httpx client (what frameworks that check
`isinstance(http_client, httpx.AsyncClient)` accept) captures like the openai SDK's own."""

from __future__ import annotations

import httpx
import httpx2
import openai
import pytest

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

BODY = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _host(server: FakeVLLMServer) -> str:
    return f"{server.host}:{server.port}"


async def test_a_plain_httpx_async_client_is_captured_with_ids(fake_server: FakeVLLMServer) -> None:
    """A chat completion posted by a plain `httpx.AsyncClient` is recorded with its exact ids,
    and the client is a real `httpx.AsyncClient` (not httpx2's)."""
    collector = tito.Collector()
    client = collector.http_client([_host(fake_server)], library="httpx")
    assert isinstance(client, httpx.AsyncClient)
    assert not isinstance(client, httpx2.AsyncClient)
    async with client, collector.episode() as ep:
        response = await client.post(f"{fake_server.base_url}/chat/completions", json=BODY)
        response.raise_for_status()
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE
    assert len(call.prompt_ids) > 0 and len(call.sampled_ids) > 0
    assert response.json()["choices"][0]["message"]["content"] is not None
    collector.close()


def test_a_plain_httpx_sync_client_is_captured(fake_server: FakeVLLMServer) -> None:
    collector = tito.Collector()
    client = collector.http_client([_host(fake_server)], asynchronous=False, library="httpx")
    assert isinstance(client, httpx.Client)
    with client, collector.episode() as ep:
        client.post(f"{fake_server.base_url}/chat/completions", json=BODY).raise_for_status()
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE]
    collector.close()


def test_the_default_is_the_openai_sdks_client_and_httpx2_is_plain() -> None:
    collector = tito.Collector()
    assert isinstance(collector.http_client(["vllm.test"]), openai.DefaultAsyncHttpxClient)
    plain = collector.http_client(["vllm.test"], asynchronous=False, library="httpx2")
    assert type(plain) is httpx2.Client
    with pytest.raises(tito.ConfigurationError, match="library must be"):
        collector.http_client(["vllm.test"], library="requests")  # type: ignore[arg-type]
    collector.close()
