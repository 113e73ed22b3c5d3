"""The fake over real HTTP: the openai SDK, keep-alive, concurrency, retries, cuts, disconnects."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.capture_replay import REPO_ROOT
from tests.support.fake_vllm_calls import MESSAGES, WEATHER_TOOL
from tito_agents.testing import FakeVLLMServer

RETURN_IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer() as srv:
        yield srv


def test_openai_sdk_reads_ids_from_bodies(server: FakeVLLMServer) -> None:
    """openai-python keeps prompt_token_ids and token_ids as extras of a real HTTP response."""
    with openai.OpenAI(base_url=server.base_url, api_key="x") as client:
        completion = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=MESSAGES,
            tools=[WEATHER_TOOL],
            extra_body=RETURN_IDS,
        )
    choice: Any = completion.choices[0]
    assert (completion.model_extra or {})["prompt_token_ids"]
    assert choice.model_extra["token_ids"][-1] == 2
    assert choice.message.tool_calls[0].function.name == "get_weather"


def test_keep_alive_reuses_one_connection(server: FakeVLLMServer) -> None:
    """Sequential requests from one client travel over one kept-alive connection."""
    before = server.stats.connections
    with httpx.Client(base_url=server.url) as client:
        for _ in range(3):
            response = client.post("/tokenize", json={"prompt": "hello"})
            assert response.status_code == 200
            assert response.headers["content-length"] == str(len(response.content))
    assert server.stats.connections == before + 1


@pytest.mark.asyncio
async def test_500_concurrent_streams_through_the_openai_sdk(server: FakeVLLMServer) -> None:
    """500 concurrent streaming chats all complete, each with ids that add up to its usage."""
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x") as client:

        async def one(seed: int) -> tuple[list[int], int]:
            stream = await client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=MESSAGES,
                stream=True,
                max_tokens=8,
                seed=seed % 7,
                temperature=1.0,
                stream_options={"include_usage": True},
                extra_body=RETURN_IDS,
            )
            ids: list[int] = []
            usage = -1
            async for chunk in stream:
                if chunk.choices:
                    extra: Any = chunk.choices[0].model_extra
                    ids += extra.get("token_ids") or []
                elif chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
            return ids, usage

        results = await asyncio.gather(*(one(i) for i in range(500)))
    assert all(len(ids) == usage == 8 for ids, usage in results)
    assert len({tuple(ids) for ids, _ in results}) > 1
    assert results[0][0] == results[7][0]  # same seed, same sample


def test_retries_after_injected_status(server: FakeVLLMServer) -> None:
    """status_before_body makes the SDK retry; stats count every attempt."""
    server.stats.reset()
    server.fail_next(2, status=503, retry_after_ms=1)
    with openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=2) as client:
        completion = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=MESSAGES
        )
        assert completion.choices[0].message.content
        assert server.stats["/v1/chat/completions"] == 3
        server.fail_next(1, status=429)
        with pytest.raises(openai.RateLimitError):
            client.with_options(max_retries=0).chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=MESSAGES,
            )


def test_cut_stream_is_an_incomplete_body(server: FakeVLLMServer) -> None:
    """cut_stream_after closes the connection mid-body; the client sees an error, not [DONE]."""
    before = server.stats.cut_streams
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 20}
    with httpx.Client(base_url=server.base_url) as client:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            client.stream(
                "POST",
                "/chat/completions",
                json=body,
                headers={"x-fake-fault": "cut_stream_after=3"},
            ) as response,
        ):
            list(response.iter_bytes())
        assert client.post("/chat/completions", json={"messages": MESSAGES}).status_code == 200
    assert server.stats.cut_streams == before + 1


@pytest.mark.asyncio
async def test_client_disconnect_mid_stream_is_survived(server: FakeVLLMServer) -> None:
    """A client leaving mid-stream is counted and the server keeps serving."""
    before = server.stats.disconnects
    body = {"messages": MESSAGES, "stream": True, "max_tokens": 50}
    async with httpx.AsyncClient(base_url=server.base_url) as client:
        async with client.stream(
            "POST", "/chat/completions", json=body, headers={"x-fake-fault": "token_latency_ms=20"}
        ) as response:
            async for _ in response.aiter_bytes():
                break
        for _ in range(100):
            if server.stats.disconnects > before:
                break
            await asyncio.sleep(0.02)
        assert server.stats.disconnects == before + 1
        assert (
            await client.post("/chat/completions", json={"messages": MESSAGES})
        ).status_code == 200


@pytest.mark.asyncio
async def test_async_context_manager_and_sse_headers() -> None:
    """`async with` starts and stops a server; SSE goes out chunked as text/event-stream."""
    async with FakeVLLMServer() as srv, httpx.AsyncClient(base_url=srv.base_url) as client:
        response = await client.post(
            "/chat/completions", json={"messages": MESSAGES, "stream": True}
        )
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.text.endswith("data: [DONE]\n\n")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.url}/health", timeout=2)


def test_command_line_serves_until_killed(tmp_path: Any) -> None:
    """`python -m tito_agents.testing.fake_vllm --port 0` serves a fake until terminated."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tito_agents.testing.fake_vllm", "--port", "0", "--latency-ms", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        base_url = line.rsplit(" ", 1)[-1].strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), line
        models = httpx.get(f"{base_url}/models", timeout=10).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
