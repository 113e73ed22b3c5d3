"""tito-agents for the OpenAI Agents SDK: capture multi-agent runs (handoffs, agents as tools) with
the exact token ids vLLM sampled, every call labelled with the agent that made it.

    import tito_agents as tito
    import tito_agents_openai_agents as tito_oa

    collector = tito.Collector("samples.jsonl")
    tito_oa.install(collector, base_url="http://127.0.0.1:8000/v1")   # the one line
    async with collector.episode(task_id="t1") as ep:
        result = await Runner.run(triage, "question")
        ep.set_reward(score(result.final_output))

The core does the capture (a transport inside the `AsyncOpenAI` client); this package only points
the SDK at that client (its default Responses model, or Chat Completions with
`api="chat_completions"`), gives agents that name no model the served model, and names the agent
of each call, from the SDK's tracing spans or, with tracing off, from the run config's
model-input filter (which `install` adds to every `Runner.run*`).
"""

from __future__ import annotations

from tito_agents_openai_agents._attribution import (
    AgentLabelFilter,
    resolve_agent,
    with_agent_labels,
)
from tito_agents_openai_agents._errors import UncapturedModelCallError
from tito_agents_openai_agents._install import AgentsCapture, install
from tito_agents_openai_agents._providers import DefaultModelProvider, TitoModelProvider
from tito_agents_openai_agents._rewards import calls_by_agent, set_agent_reward
from tito_agents_openai_agents._runner import TitoAgentRunner
from tito_agents_openai_agents._spans import AgentLabel, AgentSpanTracker
from tito_agents_openai_agents._stats import AgentsStats, Uncaptured

__version__ = "0.1.0"

__all__ = [
    "AgentLabel",
    "AgentLabelFilter",
    "AgentSpanTracker",
    "AgentsCapture",
    "AgentsStats",
    "DefaultModelProvider",
    "TitoAgentRunner",
    "TitoModelProvider",
    "Uncaptured",
    "UncapturedModelCallError",
    "__version__",
    "calls_by_agent",
    "install",
    "resolve_agent",
    "set_agent_reward",
    "with_agent_labels",
]
