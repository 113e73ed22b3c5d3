"""tito-agents for Agno: every captured call labelled with the Agno agent (or team) that made it.

    import openai
    import tito_agents as tito
    import tito_agents_agno
    from agno.agent import Agent
    from agno.models.vllm import VLLM

    collector = tito.Collector("samples.jsonl")
    tito_agents_agno.install()                                         # agent names
    url = "http://127.0.0.1:8000/v1"
    model = VLLM(id="Qwen/Qwen3-8B", base_url=url, api_key="x",
                 client=collector.wrap(openai.OpenAI(base_url=url, api_key="x")),
                 async_client=collector.wrap(openai.AsyncOpenAI(base_url=url, api_key="x")))
    agent = Agent(model=model, name="solver")
    async with collector.episode(task_id="t1") as ep:
        result = await agent.arun("question")
        ep.set_reward(score(result.content))

The core does the capture (the wrapped openai clients Agno's model holds); this package names
the agent of each call (`install`).
"""

from __future__ import annotations

from tito_agents_agno._attribution import (
    FRAMEWORK,
    SUPPORTED_AGNO,
    check_agno_version,
    install,
    resolve_agent,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "SUPPORTED_AGNO",
    "__version__",
    "check_agno_version",
    "install",
    "resolve_agent",
    "uninstall",
]
