"""tito-agents for Microsoft Agent Framework: every captured call labelled with the agent that
made it, streamed or not, an agent used as another agent's tool included.

    import openai
    import tito_agents as tito
    import tito_agents_agent_framework
    from agent_framework import Agent
    from agent_framework.openai import OpenAIChatCompletionClient

    collector = tito.Collector("samples.jsonl")
    client = collector.wrap(openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    chat = OpenAIChatCompletionClient(model="Qwen/Qwen3-8B", async_client=client)
    agent = Agent(client=chat, name="solver", middleware=[tito_agents_agent_framework.AgentNames()])
    async with collector.episode(task_id="t1") as ep:
        result = await agent.run("question")
        ep.set_reward(score(result.text))

The core does the capture (a transport inside the openai client the chat client holds); this
package's agent middleware names the agent of each call (`AgentNames`).
"""

from __future__ import annotations

from tito_agents_agent_framework._middleware import FRAMEWORK, AgentNames, resolve_agent

__version__ = "0.1.0"

__all__ = ["FRAMEWORK", "AgentNames", "__version__", "resolve_agent"]
