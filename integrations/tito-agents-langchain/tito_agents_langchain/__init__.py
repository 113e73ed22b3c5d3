"""tito-agents for LangChain and LangGraph: one line and one callback capture an existing agent.

    import tito_agents as tito
    from tito_agents_langchain import TitoCallbackHandler, wrap

    collector = tito.Collector("samples.jsonl")
    llm = wrap(ChatOpenAI(model=MODEL, base_url=VLLM_URL, api_key="EMPTY"), collector)
    handler = TitoCallbackHandler(collector)
    await graph.ainvoke(inputs, config={"callbacks": [handler]})   # one episode per invocation

`wrap` makes the model capture the exact token ids vLLM sampled (through the tito-agents
transport); the handler scopes one episode per root run and labels every call with the agent that
made it (a `create_agent` name, a supervisor's or swarm's agent node, a plain graph's node) and the
chain of agents around it, so concurrent invocations never mix and a multi-agent graph yields one
trajectory per agent. `Collector` is `tito_agents.Collector`, re-exported so that one import line is enough.
"""

from __future__ import annotations

from tito_agents import Collector
from tito_agents_langchain._agents import agent_path
from tito_agents_langchain._attribution import (
    LABEL_KEYS,
    current_episode,
    node_agent,
    set_step_reward,
)
from tito_agents_langchain._handler import TitoCallbackHandler
from tito_agents_langchain._messages import METADATA_KEY, call_id_of
from tito_agents_langchain._scopes import CaptureWarning
from tito_agents_langchain._wrap import wrap

__version__ = "0.1.0"

__all__ = [
    "LABEL_KEYS",
    "METADATA_KEY",
    "CaptureWarning",
    "Collector",
    "TitoCallbackHandler",
    "__version__",
    "agent_path",
    "call_id_of",
    "current_episode",
    "node_agent",
    "set_step_reward",
    "wrap",
]
