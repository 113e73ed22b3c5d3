"""tito-agents for LlamaIndex: every captured call labelled with the workflow agent that made
it, alone or in an `AgentWorkflow`.

    import openai
    import tito_agents as tito
    import tito_agents_llamaindex
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.llms.openai_like import OpenAILike

    collector = tito.Collector("samples.jsonl")
    tito_agents_llamaindex.install()                                   # agent names
    url = "http://127.0.0.1:8000/v1"
    llm = OpenAILike(model="Qwen/Qwen3-8B", api_base=url, api_key="x", is_chat_model=True,
                     is_function_calling_model=True,
                     openai_client=collector.wrap(openai.OpenAI(base_url=url, api_key="x")),
                     async_openai_client=collector.wrap(openai.AsyncOpenAI(base_url=url, api_key="x")))
    agent = FunctionAgent(llm=llm, name="solver", tools=[...])
    async with collector.episode(task_id="t1") as ep:
        result = await agent.run("question")
        ep.set_reward(score(str(result)))

The core does the capture (the wrapped openai clients the LLM holds); this package names the
agent of each call (`install`).
"""

from __future__ import annotations

from tito_agents_llamaindex._attribution import (
    FRAMEWORK,
    SUPPORTED_LLAMA_INDEX,
    check_llama_index_version,
    install,
    resolve_agent,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "SUPPORTED_LLAMA_INDEX",
    "__version__",
    "check_llama_index_version",
    "install",
    "resolve_agent",
    "uninstall",
]
