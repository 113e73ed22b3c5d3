"""Hooks for adapter authors: how a framework integration tells capture who is calling.

Users of the library need none of this (`tito_agents` has what they use); an integration package
for a framework (see `integrations/`) plugs in here:

* `register_resolver(fn)`: `fn()` runs inside the capture transport when a request is sent and
  returns an `Attribution` (episode, agent, labels) from the framework's own context, or None.
* `current_episode()` / `current_agent()`: what the contextvars hold at this point.
* `ContextThreadPoolExecutor`: a thread pool whose tasks run in the submitter's context (raw
  threads do not copy contextvars; `tito_agents.bind` does it for one function).
* `captures(client)`: whether a client the framework holds really goes through capture, so an
  adapter can name an unwrapped client before its calls are lost.
* `Episode.note_model_call(framework)` (on `current_episode()`): the framework completed one model
  call; at the episode's end, model calls beyond the captured requests are logged with the fix
  and counted (`CollectorStats.bypassed_calls`), so calls that went around capture are never
  silent. `framework` is the name the core's fixes know it by (docs/frameworks.md).
* `http_module_of(client)`: the HTTP library (httpx or httpx2) a client comes from, for code
  that builds requests or responses for that client (the gateway's forwarder does).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tito_agents._capture import CaptureCore
from tito_agents._http import http_module_of
from tito_agents.episodes import (
    Attribution,
    ContextThreadPoolExecutor,
    Resolver,
    current_agent,
    current_episode,
    register_resolver,
    unregister_resolver,
)

__all__ = [
    "Attribution",
    "ContextThreadPoolExecutor",
    "Resolver",
    "captures",
    "current_agent",
    "current_episode",
    "http_module_of",
    "register_resolver",
    "unregister_resolver",
]


def captures(client: Any) -> bool:
    """Whether `client` (an `openai.OpenAI` / `AsyncOpenAI`) sends its requests through a tito
    capture transport that treats its own `base_url` host as a vLLM host. False for a client
    that was never wrapped, or whose host is not among the `vllm_hosts` it was wrapped with."""
    http_client = getattr(client, "_client", None)
    base_url = getattr(client, "base_url", None)
    if http_client is None or base_url is None:
        return False
    core = getattr(getattr(http_client, "_transport", None), "core", None)
    if not isinstance(core, CaptureCore):
        return False
    parts = urlsplit(str(base_url))
    return core.is_vllm_host(parts.hostname or "", parts.port)
