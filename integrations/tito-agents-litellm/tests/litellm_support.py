"""Calls through LiteLLM as an agent makes them, on every route, each prompt carrying a marker
that names the episode which made it (so attribution is checked by content)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import litellm

from tito_agents.calls import Call
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

PREFIXES = ("hosted_vllm", "openai")
"""LiteLLM's two routes to vLLM: its own HTTP handler, and the openai SDK."""


def host_of(server: FakeVLLMServer) -> str:
    parts = urlsplit(server.base_url)
    return f"{parts.hostname}:{parts.port}"


def call_kwargs(server: FakeVLLMServer, prefix: str, marker: str, **extra: Any) -> dict[str, Any]:
    """The keyword arguments of one `litellm.completion` / `acompletion` call."""
    return {
        "model": f"{prefix}/{MODEL_NAME}",
        "api_base": server.base_url,
        "api_key": "EMPTY",
        "messages": [{"role": "user", "content": f"{marker}: say hello"}],
        "max_tokens": 8,
        **extra,
    }


def complete(server: FakeVLLMServer, prefix: str, marker: str, *, stream: bool) -> str:
    """One sync call, its stream read to the end; the text the model said."""
    response = litellm.completion(**call_kwargs(server, prefix, marker, stream=stream))
    if stream:
        return "".join(chunk.choices[0].delta.content or "" for chunk in response)
    return str(response.choices[0].message.content)


async def acomplete(server: FakeVLLMServer, prefix: str, marker: str, *, stream: bool) -> str:
    """One async call, its stream read to the end; the text the model said."""
    response = await litellm.acompletion(**call_kwargs(server, prefix, marker, stream=stream))
    if stream:
        return "".join([chunk.choices[0].delta.content or "" async for chunk in response])
    return str(response.choices[0].message.content)


def marker_of(call: Call) -> str:
    """The marker in a captured call's user message."""
    messages = call.messages or []
    text = str(messages[-1].get("content", "")) if messages else ""
    return text.split(":")[0]
