"""`TitoRolloutWorker` against the fake vLLM over HTTP: a responder that says distinct, recorded
ids on every call (so a test can check the queued rows carry exactly what was sampled), agents,
and a worker factory."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Sequence
from typing import Any

import openai

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import tito_agents as tito
from tito_agents.rl.trl_async import TitoRolloutWorker
from tito_agents.testing.fake_vllm import RequestView
from tito_agents.testing.smollm2 import MODEL_NAME

EOS_ID = 2
"""SmolLM2's `<|im_end|>`: the fake stops a chat turn on it."""

TIMEOUT_S = 30.0
"""How long a test waits on the worker's queue or its end (generous: nothing here is timed)."""


class RecordingModel:
    """A fake-vLLM responder whose every answer is new ids, recorded in call order."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.said: list[list[int]] = []

    def __call__(self, view: RequestView) -> list[int]:
        with self._lock:
            k = next(self._counter)
            ids = [300 + k % 200, 600 + k // 200, 900 + k % 13, EOS_ID]
            self.said.append(ids)
        return ids


async def ask(prompt: Any, client: openai.AsyncOpenAI) -> str:
    """One chat turn of `prompt`; the answer's text."""
    response = await client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": str(prompt)}], max_tokens=16
    )
    return response.choices[0].message.content or ""


async def length_agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
    """One turn; its reward is the answer's length (distinct answers, distinct rewards)."""
    return float(len(await ask(prompt, client)))


class Gate:
    """An agent that asks once, waits for the test to `open()` it, then asks again: the test
    moves the model version while the episode is between its two calls."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self._open = threading.Event()

    def open(self) -> None:
        self._open.set()

    async def __call__(self, prompt: Any, client: openai.AsyncOpenAI) -> float:
        messages: Any = [{"role": "user", "content": str(prompt)}]
        for turn in range(2):
            response = await client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=16
            )
            messages.append({"role": "assistant", "content": response.choices[0].message.content})
            messages.append({"role": "user", "content": "go on"})
            if turn == 0:
                self.waiting.set()
                await asyncio.to_thread(self._open.wait, TIMEOUT_S)
        return 1.0


def make_worker(
    base_url: str,
    agent: Any,
    dataset: Sequence[dict[str, Any]],
    *,
    sessions: bool = False,
    **worker_kw: Any,
) -> TitoRolloutWorker:
    collector = tito.Collector(capture_logprobs=True, assembly="merged")
    client = collector.wrap(openai.AsyncOpenAI(base_url=base_url, api_key="x"), sessions=sessions)
    worker_kw.setdefault("num_generations", 2)
    return TitoRolloutWorker(agent, collector, client, dataset, **worker_kw)


def take(worker: TitoRolloutWorker, count: int) -> list[Any]:
    """`count` samples off the worker's queue, waiting on the queue itself."""
    return [worker.rollout_buffer.get(timeout=TIMEOUT_S) for _ in range(count)]


def drain(worker: TitoRolloutWorker) -> list[Any]:
    """Everything on the queue once the worker has ended."""
    assert worker.wait_done(TIMEOUT_S), "the worker did not end"
    out = []
    while not worker.rollout_buffer.empty():
        out.append(worker.rollout_buffer.get_nowait())
    return out


def completion_ids(sample: Any) -> list[int]:
    """The ids a `RolloutSample` trains on (its completion mask's tokens)."""
    return [int(t) for t, m in zip(sample.input_ids, sample.completion_mask, strict=True) if m]
