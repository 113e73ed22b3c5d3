"""tito-agents for Strands Agents: every captured call labelled with the Strands agent that made
it, an agent run inside another agent's tool included.

    import openai
    import tito_agents as tito
    import tito_agents_strands
    from strands import Agent
    from strands.models.openai import OpenAIModel

    collector = tito.Collector("samples.jsonl")
    client = collector.wrap(openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    model = OpenAIModel(client=client, model_id="Qwen/Qwen3-8B")
    agent = Agent(model=model, name="solver", plugins=[tito_agents_strands.AgentNames()])
    async with collector.episode(task_id="t1") as ep:
        result = await agent.invoke_async("question")
        ep.set_reward(score(str(result)))

The core does the capture (a transport inside the openai client the model reuses); this
package's plugin names the agent of each call and counts its model calls (`AgentNames`).
"""

from __future__ import annotations

from tito_agents_strands._plugin import FRAMEWORK, AgentNames, resolve_agent

__version__ = "0.1.0"

__all__ = ["FRAMEWORK", "AgentNames", "__version__", "resolve_agent"]
