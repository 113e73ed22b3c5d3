"""What the token-in session tests over the fake vLLM share: a responder that calls a tool until
it has a result, a sync client on the pure fake core (with an optional hook on each request), and
the prefix check between consecutive calls."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import openai

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeResponse, FakeVLLM, RequestView, mock_transport


def responder(view: RequestView) -> str:
    """Calls the tool until a tool result is the last message, then answers in words."""
    messages = view.messages or []
    if messages and messages[-1].get("role") == "tool":
        return "It is sunny in the dataset of Paris, with a database of clouds."
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


Hook = Callable[[str, bytes], tuple[str, bytes] | FakeResponse]


def make_client(
    fake: FakeVLLM, collector: tito.Collector, hook: Hook | None = None, *, sessions: bool = True
) -> openai.OpenAI:
    """A sync openai client whose HTTP goes to the pure fake core (optionally through `hook`,
    which may change a request's path and body, or answer it instead of the fake)."""

    def handle(method: str, path: str, body: bytes, headers: Mapping[str, str]) -> FakeResponse:
        if hook is not None:
            hooked = hook(path, body)
            if isinstance(hooked, FakeResponse):
                return hooked
            path, body = hooked
        return fake.handle(method, path, body, headers)

    client = openai.OpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        http_client=openai.DefaultHttpxClient(transport=mock_transport(handle)),
    )
    return collector.wrap(client, sessions=sessions)


def extends(prev: tito.Call, nxt: tito.Call) -> bool:
    head = np.concatenate((prev.prompt_ids, prev.sampled_ids))
    return nxt.prompt_ids.shape[0] > head.shape[0] and bool(
        np.array_equal(nxt.prompt_ids[: head.shape[0]], head)
    )


def recording_hook(asks: list[dict[str, Any]]) -> Hook:
    """A hook that keeps the body of every /tokenize the session sends."""

    def hook(path: str, body: bytes) -> tuple[str, bytes]:
        if path == "/tokenize":
            asks.append(json.loads(body))
        return path, body

    return hook
