"""Fixtures: one fake vLLM per session, ChatOpenAI models that own (and close) their HTTP clients,
and the SmolLM2 tokenizer for checking captured ids by content."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from langchain_openai import ChatOpenAI
from lc_support import MakeModel, responder

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer, Faults
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer


@pytest.fixture(scope="session")
def fake_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(tokenization="drift", responder=responder)) as server:
        yield server


@pytest.fixture(autouse=True)
def clean_faults(fake_server: FakeVLLMServer) -> Iterator[None]:
    """Every test starts and ends with the fake's fault switches off."""
    fake_server.fake.config.faults = Faults()
    yield
    fake_server.fake.config.faults = Faults()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return load_tokenizer()


@pytest.fixture
def collector() -> Iterator[tito.Collector]:
    with tito.Collector(capture_logprobs=True) as collector:
        yield collector


@pytest.fixture
async def make_model(fake_server: FakeVLLMServer) -> AsyncIterator[MakeModel]:
    """Build ChatOpenAI models on the fake, each with HTTP clients of its own, closed at the end."""
    clients: list[Any] = []

    def make(**kwargs: Any) -> ChatOpenAI:
        sync_http = openai.DefaultHttpxClient()
        async_http = openai.DefaultAsyncHttpxClient()
        clients.extend([sync_http, async_http])
        options: dict[str, Any] = {
            "model": MODEL_NAME,
            "base_url": fake_server.base_url,
            "api_key": "EMPTY",
            "max_tokens": 48,
            "http_client": sync_http,
            "http_async_client": async_http,
            **kwargs,
        }
        return ChatOpenAI(**options)

    yield make
    for client in clients:
        if isinstance(client, openai.DefaultAsyncHttpxClient):
            await client.aclose()
        else:
            client.close()
