"""tito-agents for AutoGen: every captured call labelled with the AutoGen agent that made it,
alone or in a team.

    import tito_agents as tito
    import tito_agents_autogen
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    collector = tito.Collector("samples.jsonl")
    tito_agents_autogen.install()                                      # agent names
    model = OpenAIChatCompletionClient(
        model="Qwen/Qwen3-8B", base_url="http://127.0.0.1:8000/v1", api_key="x",
        model_info=MODEL_INFO, http_client=collector.http_client(["127.0.0.1:8000"]),
    )
    agent = AssistantAgent("solver", model_client=model)
    async with collector.episode(task_id="t1") as ep:
        result = await agent.run(task="question")
        ep.set_reward(score(result.messages[-1].content))

The core does the capture (the capturing HTTP client AutoGen's openai client is built on); this
package names the agent of each call (`install`).
"""

from __future__ import annotations

from tito_agents_autogen._attribution import (
    FRAMEWORK,
    SUPPORTED_AUTOGEN,
    check_autogen_version,
    install,
    resolve_agent,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "SUPPORTED_AUTOGEN",
    "__version__",
    "check_autogen_version",
    "install",
    "resolve_agent",
    "uninstall",
]
