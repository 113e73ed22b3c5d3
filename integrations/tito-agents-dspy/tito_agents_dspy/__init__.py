"""tito-agents for DSPy: every captured call labelled with the DSPy program module that made it,
a sub-program's included.

    import dspy
    import tito_agents as tito
    import tito_agents_dspy
    import tito_agents_litellm

    collector = tito.Collector("samples.jsonl")
    tito_agents_litellm.install(collector, vllm_hosts=["my-vllm:8000"])  # capture
    tito_agents_dspy.install()                                          # agent names
    lm = dspy.LM("hosted_vllm/Qwen/Qwen3-8B", api_base="http://my-vllm:8000/v1",
                 engine="litellm", cache=False)
    dspy.configure(lm=lm)
    with collector.episode(task_id="t1") as ep:
        ep.set_reward(score(dspy.ChainOfThought("question -> answer")(question="...")))

Capture is LiteLLM's (DSPy's `engine="litellm"` calls it); this package names the module of
each call (`install`).
"""

from __future__ import annotations

from tito_agents_dspy._attribution import (
    FRAMEWORK,
    SUPPORTED_DSPY,
    agent_of,
    check_dspy_version,
    install,
    resolve_agent,
    uninstall,
)

__version__ = "0.1.0"

__all__ = [
    "FRAMEWORK",
    "SUPPORTED_DSPY",
    "__version__",
    "agent_of",
    "check_dspy_version",
    "install",
    "resolve_agent",
    "uninstall",
]
