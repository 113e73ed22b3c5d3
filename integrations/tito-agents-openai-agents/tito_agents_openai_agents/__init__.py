"""tito-agents for the OpenAI Agents SDK: capture multi-agent runs (handoffs, agents as tools) with
the exact token ids vLLM sampled, every call labelled with the agent that made it.

    import tito_agents as tito
    import tito_agents_openai_agents as tito_oa

    collector = tito.Collector("samples.jsonl")
    capture = tito_oa.install(collector, base_url="http://127.0.0.1:8000/v1")
    async with collector.episode(task_id="t1") as ep:
        result = await Runner.run(triage, "question", run_config=capture.run_config())
        ep.set_reward(score(result.final_output))

The core does the capture (a transport inside the `AsyncOpenAI` client); this package only points
the SDK at that client on the chat-completions path and names the agent of each call, from the
SDK's tracing spans or, with tracing off, from the run config's model-input filter.
"""

from __future__ import annotations

from tito_agents_openai_agents._attribution import (
    AgentLabelFilter,
    resolve_agent,
    with_agent_labels,
)
from tito_agents_openai_agents._errors import ResponsesAPIError, UncapturedModelCallError
from tito_agents_openai_agents._install import AgentsCapture, TitoModelProvider, install
from tito_agents_openai_agents._rewards import calls_by_agent, set_agent_reward
from tito_agents_openai_agents._spans import AgentLabel, AgentSpanTracker
from tito_agents_openai_agents._stats import AgentsStats, Uncaptured

__version__ = "0.1.0"

__all__ = [
    "AgentLabel",
    "AgentLabelFilter",
    "AgentSpanTracker",
    "AgentsCapture",
    "AgentsStats",
    "ResponsesAPIError",
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
