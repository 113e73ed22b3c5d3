"""Replay of real vLLM 0.32 captures (tests/data/captures) through an in-process transport."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURES = REPO_ROOT / "tests" / "data" / "captures"
REAL_VLLM = REPO_ROOT / "tests" / "data" / "real_vllm"
"""Captures of a real vLLM 0.32 serving SmolLM2-135M (same file format, real English and ids)."""
BASE_URL = "http://vllm.test:8000/v1"


@dataclass
class Capture:
    """One recorded exchange: the request a vLLM got and the status and bytes it answered."""

    name: str
    path: str
    request: dict[str, Any]
    status: int
    body: bytes
    method: str = "POST"

    @property
    def is_stream(self) -> bool:
        return self.body.startswith((b"data:", b"event:", b":"))

    def events(self) -> list[bytes]:
        """The SSE events of a streaming capture, each with its blank-line terminator."""
        return [e + b"\n\n" for e in self.body.split(b"\n\n") if e.strip()]

    def json(self) -> Any:
        return json.loads(self.body)


def load_capture(name: str, directory: Path = CAPTURES) -> Capture:
    """`name` from `directory`; `real/<name>` is one of the SmolLM2 captures in `REAL_VLLM`."""
    if name.startswith("real/"):
        name, directory = name.removeprefix("real/"), REAL_VLLM
    raw = (directory / f"{name}.txt").read_bytes()
    head, body = raw.split(b"\n\n", 1)
    lines = head.decode().splitlines()
    method, path = lines[0].split(" ", 1)
    request = json.loads(lines[1].split(" ", 1)[1])
    status = int(lines[2].split(" ", 1)[1])
    return Capture(name, path, request, status, body, method)


def capture_names(directory: Path = CAPTURES) -> list[str]:
    """The names of the captures in `directory`, sorted."""
    return sorted(p.stem for p in directory.glob("*.txt"))


@dataclass
class Replay:
    """An in-process server answering every request with scripted captures, in order."""

    responses: list[Capture | int]
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    chunked: bool = True

    def _next(self, request: httpx2.Request) -> Capture | int:
        self.received.append(json.loads(request.content) if request.content else {})
        self.headers.append(dict(request.headers))
        item = self.responses[0] if len(self.responses) == 1 else self.responses.pop(0)
        return item

    def sync_handler(self, request: httpx2.Request) -> httpx2.Response:
        item = self._next(request)
        if isinstance(item, int):
            return httpx2.Response(item, json={"error": {"message": "busy", "code": item}})
        if item.is_stream:
            events = item.events()

            def gen() -> Iterator[bytes]:
                yield from events

            return httpx2.Response(
                item.status, headers={"content-type": "text/event-stream"}, content=gen()
            )
        return httpx2.Response(
            item.status, headers={"content-type": "application/json"}, content=item.body
        )

    async def async_handler(self, request: httpx2.Request) -> httpx2.Response:
        item = self._next(request)
        if isinstance(item, int):
            return httpx2.Response(item, json={"error": {"message": "busy", "code": item}})
        if item.is_stream:
            events = item.events()

            async def agen() -> AsyncIterator[bytes]:
                for e in events:
                    yield e

            return httpx2.Response(
                item.status, headers={"content-type": "text/event-stream"}, content=agen()
            )
        return httpx2.Response(
            item.status, headers={"content-type": "application/json"}, content=item.body
        )


def replay_clients(replay: Replay, base_url: str = BASE_URL) -> tuple[Any, Any]:
    """A sync and an async openai client whose HTTP goes to `replay`."""
    import openai

    sync = openai.OpenAI(
        base_url=base_url,
        api_key="sk-secret-test-key",
        max_retries=2,
        http_client=openai.DefaultHttpxClient(transport=httpx2.MockTransport(replay.sync_handler)),
    )
    asyn = openai.AsyncOpenAI(
        base_url=base_url,
        api_key="sk-secret-test-key",
        max_retries=2,
        http_client=openai.DefaultAsyncHttpxClient(
            transport=httpx2.MockTransport(replay.async_handler)
        ),
    )
    return sync, asyn


RequestFn = Callable[..., Any]


def split_request(request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """openai SDK arguments for a capture's request: vLLM-only fields go to extra_body."""
    req = dict(request)
    stream = bool(req.pop("stream", False))
    base = {k: req.pop(k) for k in ("model", "messages", "prompt") if k in req}
    base["extra_body"] = req
    return base, stream


def run_sync(client: Any, cap: Capture) -> Any:
    """Send a capture's request through a sync openai client; a stream is read to its end."""
    base, stream = split_request(cap.request)
    create = client.chat.completions.create if "messages" in base else client.completions.create
    result = create(**base, stream=stream)
    if stream:
        return [chunk for chunk in result]
    return result


async def run_async(client: Any, cap: Capture) -> Any:
    """`run_sync` for an async openai client."""
    base, stream = split_request(cap.request)
    create = client.chat.completions.create if "messages" in base else client.completions.create
    result = await create(**base, stream=stream)
    if stream:
        return [chunk async for chunk in result]
    return result


MSG = [{"role": "user", "content": "x"}]
"""A one-message chat: what a test sends where the replayed answer does not depend on it."""


def streamed_ids(cap: Capture) -> tuple[list[int], list[int]]:
    """(prompt ids, sampled ids) of a one-choice chat stream capture, read from its events."""
    prompt: list[int] = []
    sampled: list[int] = []
    for event in cap.events():
        data = event.strip()[len(b"data: ") :]
        if data == b"[DONE]":
            continue
        chunk = json.loads(data)
        prompt = chunk.get("prompt_token_ids") or prompt
        for choice in chunk["choices"]:
            sampled += choice.get("token_ids") or []
    return prompt, sampled
