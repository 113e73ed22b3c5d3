"""tito-agents: capture the exact token ids vLLM sampled inside agent frameworks, attribute every
call to its episode and agent, and write trainer-ready samples.

    import tito_agents as tito
    collector = tito.Collector("samples.jsonl")
    client = collector.wrap(openai.AsyncOpenAI(base_url=VLLM_URL, api_key="EMPTY"))
    async with collector.episode(task_id="t1") as ep:
        ...  # the agent's own code, unchanged
        ep.set_reward(1.0)
"""

from __future__ import annotations

from tito_agents.assembly import AssemblyMode, assemble
from tito_agents.calls import Call, CallStatus
from tito_agents.collector import Collector
from tito_agents.config import ErrorPolicy, OutsideEpisode, SessionHistory, SinkErrors
from tito_agents.episodes import Episode, agent, bind, current_episode, labels
from tito_agents.errors import (
    CaptureError,
    ConfigurationError,
    EpisodeCaptureError,
    MissingTokenIdsError,
    SinkError,
    TitoError,
)
from tito_agents.samples import Sample
from tito_agents.sinks import Sink, open_sink, read_samples

__version__ = "0.1.0"

# What users of the library reach for. The rest has one home each: sinks in `tito_agents.sinks`,
# assembly tools in `tito_agents.assembly`, every error in `tito_agents.errors`, hooks for
# framework adapters in `tito_agents.integration`. tests/unit/test_public_api.py pins this list.
__all__ = [
    "AssemblyMode",
    "Call",
    "CallStatus",
    "CaptureError",
    "Collector",
    "ConfigurationError",
    "Episode",
    "EpisodeCaptureError",
    "ErrorPolicy",
    "MissingTokenIdsError",
    "OutsideEpisode",
    "Sample",
    "SessionHistory",
    "Sink",
    "SinkError",
    "SinkErrors",
    "TitoError",
    "__version__",
    "agent",
    "assemble",
    "bind",
    "current_episode",
    "labels",
    "open_sink",
    "read_samples",
]
