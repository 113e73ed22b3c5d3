"""The runner `install` makes the SDK's default: `Runner.run`, `run_sync` and `run_streamed` get
tito's run config without the user passing one, so the documented one line is enough.

`Runner.run*` are class methods that hand every run to the SDK's default `AgentRunner`
(`agents.run.set_default_agent_runner`). This subclass only completes the run's `RunConfig`
before the SDK's own code runs: the model provider resolves agents that name no model to the
installed model (the SDK's default would ask the vLLM server for "gpt-…"), and the model-input
filter labels calls with their agent when tracing is off. `run_sync` runs through `run`, and
agents run as tools inherit the completed config, so both are covered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents import Agent, RunResult, RunResultStreaming
from agents.run import AgentRunner

Completer = Callable[[Any], Any]
"""Turns the run config a caller passed (a `RunConfig`, a dict or None) into the one to use."""


class TitoAgentRunner(AgentRunner):
    """`AgentRunner` that completes each run's config with `complete` (see the module docstring)."""

    def __init__(self, complete: Completer) -> None:
        super().__init__()
        self.complete = complete

    async def run(self, starting_agent: Agent[Any], input: Any, **kwargs: Any) -> RunResult:
        kwargs["run_config"] = self.complete(kwargs.get("run_config"))
        return await super().run(starting_agent, input, **kwargs)

    def run_streamed(
        self, starting_agent: Agent[Any], input: Any, **kwargs: Any
    ) -> RunResultStreaming:
        kwargs["run_config"] = self.complete(kwargs.get("run_config"))
        return super().run_streamed(starting_agent, input, **kwargs)
