"""tito-agents for CrewAI: a CrewAI LLM's calls captured, and every captured call labelled with
the role of the agent that made it, a delegated coworker's included.

    import tito_agents as tito
    import tito_agents_crewai
    from crewai import LLM, Agent, Crew, Task

    collector = tito.Collector("samples.jsonl")
    tito_agents_crewai.install()                                       # agent names
    llm = tito_agents_crewai.wrap_llm(collector, LLM(model="hosted_vllm/Qwen/Qwen3-8B",
                                                     base_url="http://my-vllm:8000/v1"))
    researcher = Agent(role="Researcher", goal="...", backstory="...", llm=llm)

The core does the capture (a transport inside the openai clients the LLM built); this package
reaches those clients (`wrap_llm`) and names the agent of each call (`install`).
"""

from __future__ import annotations

from tito_agents_crewai._attribution import (
    FRAMEWORK,
    SUPPORTED_CREWAI,
    check_crewai_version,
    install,
    resolve_agent,
    uninstall,
    wrap_llm,
)

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "SUPPORTED_CREWAI",
    "__version__",
    "check_crewai_version",
    "install",
    "resolve_agent",
    "uninstall",
    "wrap_llm",
]
