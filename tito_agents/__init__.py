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

from tito_agents._capture import ErrorPolicy, OutsideEpisode
from tito_agents.assembly import (
    AssemblyMode,
    AssemblyOptions,
    AssemblyReport,
    Divergence,
    DivergenceKind,
    EpisodeContext,
    assemble,
    assemble_episode,
    assembly_report,
    merged_samples,
)
from tito_agents.calls import Call, CallStatus, Endpoint
from tito_agents.collector import CaptureStats, Collector, SinkErrors
from tito_agents.episodes import (
    Attribution,
    ContextThreadPoolExecutor,
    Episode,
    EpisodeReport,
    agent,
    bind,
    current_agent,
    current_episode,
    labels,
    register_resolver,
    unregister_resolver,
)
from tito_agents.errors import (
    CaptureError,
    ConfigurationError,
    EpisodeCaptureError,
    IncompleteCallError,
    MalformedResponseError,
    MissingTokenIdsError,
    OutsideEpisodeError,
    SampleFormatError,
    SinkError,
    TitoError,
    TokenCountMismatchError,
)
from tito_agents.samples import CallSpan, Sample
from tito_agents.sinks import CallbackSink, JsonlSink, MemorySink, Sink, open_sink, read_samples

__version__ = "0.1.0"

__all__ = [
    "AssemblyMode",
    "AssemblyOptions",
    "AssemblyReport",
    "Attribution",
    "Call",
    "CallSpan",
    "CallStatus",
    "CallbackSink",
    "CaptureError",
    "CaptureStats",
    "Collector",
    "ConfigurationError",
    "ContextThreadPoolExecutor",
    "Divergence",
    "DivergenceKind",
    "Endpoint",
    "Episode",
    "EpisodeCaptureError",
    "EpisodeContext",
    "EpisodeReport",
    "ErrorPolicy",
    "IncompleteCallError",
    "JsonlSink",
    "MalformedResponseError",
    "MemorySink",
    "MissingTokenIdsError",
    "OutsideEpisode",
    "OutsideEpisodeError",
    "Sample",
    "SampleFormatError",
    "Sink",
    "SinkError",
    "SinkErrors",
    "TitoError",
    "TokenCountMismatchError",
    "__version__",
    "agent",
    "assemble",
    "assemble_episode",
    "assembly_report",
    "bind",
    "current_agent",
    "current_episode",
    "labels",
    "merged_samples",
    "open_sink",
    "read_samples",
    "register_resolver",
    "unregister_resolver",
]
