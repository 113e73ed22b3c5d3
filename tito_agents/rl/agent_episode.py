"""One episode of your agent function under tito capture, for the trainers that call it per prompt.

    async def agent(prompt, client, **fields) -> float | None: ...   # your agent; its reward

A trainer's plug point (verl's agent loop, SkyRL's generator) hands over a prompt and an
OpenAI-compatible server; `run_episode` gives the agent an `openai.AsyncOpenAI` on that server,
wrapped by the process's collector (logprobs on, merged assembly), runs it inside a tito episode
and returns the episode's merged samples (one per linked segment) with the agent's reward on
them. Whatever keeps the trainer from training on them is an `EpisodeFailure` whose `kind` names
it, so each trainer's adapter turns it into the row its trainer expects instead of a crash in the
trainer's loop. It needs no trainer installed.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import openai

from tito_agents.collector import Collector
from tito_agents.errors import ConfigurationError
from tito_agents.samples import Sample
from tito_agents.sinks import CallbackSink

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Trainers keep rewards as float32 (verl's `rm_scores`, SkyRL's reward tensor): a larger reward
turns into inf there."""

Agent = Callable[..., Awaitable[float | None]]
"""`async def agent(prompt, client, **fields) -> reward`: one rollout of the prompt through the
collector-wrapped `client`; None keeps the reward it set on the episode
(`tito_agents.current_episode().set_reward`)."""

_collector: Collector | None = None


def _discard(samples: object) -> None:
    """The samples reach the trainer through the adapter's return value; nothing else keeps them."""


def shared_collector() -> Collector:
    """The process's collector (trainers build an adapter per row or per run; the capture state is
    shared)."""
    global _collector
    if _collector is None:
        _collector = Collector(CallbackSink(_discard), capture_logprobs=True, assembly="merged")
    return _collector


def load_agent(path: str) -> Agent:
    """The agent function named `module:function` (what a trainer's configuration names)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"agent {path!r} must be 'module:function'")
    agent = getattr(importlib.import_module(module_name), attr)
    if not inspect.iscoroutinefunction(agent):
        raise ConfigurationError(f"agent {path!r} must be an `async def agent(prompt, client)`")
    return agent  # type: ignore[no-any-return]


def agent_fields(agent: Agent, row: Mapping[str, Any]) -> dict[str, Any]:
    """The fields `agent` takes as keywords: those it names, or all with `**fields`."""
    params = inspect.signature(agent).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(row)
    named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return {k: v for k, v in row.items() if k in named - {"prompt", "client"}}


class EpisodeFailure(Exception):
    """Why an episode gives the trainer nothing to train on; `kind` is the adapter's failure count
    key ("agent_error", "no_call", "bad_reward", or the adapter's own)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


def finite_reward(value: object) -> float | None:
    """`value` as a finite float (None stays None), or `EpisodeFailure` saying what it was."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EpisodeFailure("bad_reward", f"the agent returned {value!r}, not a number")
    if not math.isfinite(float(value)) or abs(float(value)) > FLOAT32_MAX:
        raise EpisodeFailure(
            "bad_reward", f"the agent returned reward {value!r}, not a finite float32 number"
        )
    return float(value)


async def run_episode(
    agent: Agent,
    prompt: Any,
    fields: Mapping[str, Any],
    *,
    base_url: str,
    group_id: str,
    sessions: bool | None = None,
) -> list[Sample]:
    """The merged samples of one run of `agent` on `prompt` against the server at `base_url`,
    each with the agent's reward; `EpisodeFailure` when there is nothing to train on.

    The agent takes, besides the prompt and the client, the `fields` it names as keywords and
    `base_url` and `collector` (what a framework agent builds its own model client from:
    LangChain's `wrap(ChatOpenAI(base_url=...), collector)`)."""
    collector = shared_collector()
    client = collector.wrap(openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY"))
    offered = {**fields, "base_url": base_url, "collector": collector}
    try:
        async with collector.episode(group_id=group_id, sessions=sessions) as ep:
            reward = finite_reward(await agent(prompt, client, **agent_fields(agent, offered)))
            if reward is not None:
                ep.set_reward(reward)
    except EpisodeFailure:
        raise
    except Exception as exc:
        raise EpisodeFailure(
            "agent_error", f"the agent raised {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        await client.close()
    samples = [s for s in ep.samples if s.view == "merged"]
    if not samples:
        raise EpisodeFailure(
            "no_call", "the agent made no captured call (it must use the client it is handed)"
        )
    if any(s.reward is None for s in samples):
        raise EpisodeFailure("bad_reward", "the agent returned no reward and set none")
    return samples
