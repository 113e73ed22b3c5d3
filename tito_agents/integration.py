"""Hooks for adapter authors: how a framework integration tells capture who is calling.

Users of the library need none of this (`tito_agents` has what they use); an integration package
for a framework (see `integrations/`) plugs in here:

* `register_resolver(fn)`: `fn()` runs inside the capture transport when a request is sent and
  returns an `Attribution` (episode, agent, labels) from the framework's own context, or None.
* `current_episode()` / `current_agent()`: what the contextvars hold at this point.
* `ContextThreadPoolExecutor`: a thread pool whose tasks run in the submitter's context (raw
  threads do not copy contextvars; `tito_agents.bind` does it for one function).
"""

from __future__ import annotations

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
    "current_agent",
    "current_episode",
    "register_resolver",
    "unregister_resolver",
]
