"""tito-agents for PydanticAI: every captured call of an agent run labelled with the name of the
agent that made it, a delegated agent's (one run inside another agent's tool) included.

    import openai
    import tito_agents as tito
    import tito_agents_pydantic_ai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    collector = tito.Collector("samples.jsonl")
    tito_agents_pydantic_ai.install()                                  # agent names
    client = collector.wrap(openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x"))
    model = OpenAIChatModel("Qwen/Qwen3-8B", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, name="solver", capabilities=[tito_agents_pydantic_ai.CaptureCheck()])
    async with collector.episode(task_id="t1") as ep:
        result = await agent.run("question")
        ep.set_reward(score(result.output))

The core does the capture (a transport inside the openai client PydanticAI's provider holds);
this package names the agent of each call (`install`, a resolver over PydanticAI's run context)
and, per agent, counts its model requests so any that went around capture are reported
(`CaptureCheck`).
"""

from __future__ import annotations

from tito_agents_pydantic_ai._attribution import FRAMEWORK, install, resolve_agent, uninstall
from tito_agents_pydantic_ai._check import CaptureCheck

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "CaptureCheck",
    "__version__",
    "install",
    "resolve_agent",
    "uninstall",
]
