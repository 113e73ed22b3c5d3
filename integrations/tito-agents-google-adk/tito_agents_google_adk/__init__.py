"""tito-agents for Google ADK: every captured call labelled with the ADK agent that made it, a
sub-agent's included.

    import openai
    import tito_agents as tito
    import tito_agents_google_adk
    from google.adk.agents import LlmAgent
    from google.adk.models.lite_llm import LiteLlm

    collector = tito.Collector("samples.jsonl")
    tito_agents_google_adk.install()                                   # agent names
    client = collector.wrap(openai.AsyncOpenAI(base_url="http://my-vllm:8000/v1", api_key="x"))
    model = LiteLlm("openai/Qwen/Qwen3-8B", api_base="http://my-vllm:8000/v1", client=client)
    agent = LlmAgent(name="solver", model=model, instruction="...")

The core does the capture (a transport inside the openai client LiteLLM is given; `hosted_vllm/`
models are captured by tito_agents_litellm.install); this package names the agent of each call.
"""

from __future__ import annotations

from tito_agents_google_adk._attribution import (
    AGENT_LABEL,
    FRAMEWORK,
    SUPPORTED_ADK,
    agent_of,
    check_adk_version,
    install,
    resolve_agent,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "AGENT_LABEL",
    "FRAMEWORK",
    "SUPPORTED_ADK",
    "__version__",
    "agent_of",
    "check_adk_version",
    "install",
    "resolve_agent",
    "uninstall",
]
