"""tito-agents for LiteLLM: capture `litellm.completion` / `acompletion` calls with the exact
token ids vLLM sampled, on both routes LiteLLM has to vLLM (`hosted_vllm/...` and `openai/...`).

    import litellm
    import tito_agents as tito
    import tito_agents_litellm

    collector = tito.Collector("samples.jsonl")
    tito_agents_litellm.install(collector, vllm_hosts=["127.0.0.1:8000"])   # the one line
    with collector.episode(task_id="t1") as ep:
        litellm.completion(model="hosted_vllm/Qwen/Qwen3-8B", api_base="http://127.0.0.1:8000/v1",
                           messages=[{"role": "user", "content": "hi"}])
        ep.set_reward(1.0)

The core does the capture (a transport inside each httpx client); this package only makes sure
every client LiteLLM sends a chat call through has it, including the ones it cached before
`install` (see `_install`).
"""

from __future__ import annotations

from tito_agents_litellm._install import (
    SUPPORTED_LITELLM,
    LiteLLMCapture,
    check_litellm_version,
    install,
)

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED_LITELLM",
    "LiteLLMCapture",
    "__version__",
    "check_litellm_version",
    "install",
]
