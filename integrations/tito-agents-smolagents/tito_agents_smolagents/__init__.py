"""tito-agents for smolagents: every captured call labelled with the smolagents agent that made
it, a managed agent's included.

    import openai
    import tito_agents as tito
    import tito_agents_smolagents
    from smolagents import OpenAIServerModel, ToolCallingAgent

    collector = tito.Collector("samples.jsonl")
    tito_agents_smolagents.install()                                   # agent names
    client = collector.wrap(openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    model = OpenAIServerModel(model_id="Qwen/Qwen3-8B", client=client)
    agent = ToolCallingAgent(tools=[], model=model, name="solver")
    with collector.episode(task_id="t1") as ep:
        ep.set_reward(score(agent.run("question")))

The core does the capture (a transport inside the openai client the model holds); this package
names the agent of each call (`install`).
"""

from __future__ import annotations

from tito_agents_smolagents._attribution import (
    FRAMEWORK,
    SUPPORTED_SMOLAGENTS,
    check_smolagents_version,
    install,
    resolve_agent,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "SUPPORTED_SMOLAGENTS",
    "__version__",
    "check_smolagents_version",
    "install",
    "resolve_agent",
    "uninstall",
]
