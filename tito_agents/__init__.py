"""tito-agents: capture the exact token ids vLLM sampled inside agent frameworks, attribute every
call to its episode and agent, and write trainer-ready samples.

    import tito_agents as tito
    collector = tito.Collector("samples.jsonl")
    client = collector.wrap(openai.AsyncOpenAI(base_url=VLLM_URL, api_key="EMPTY"))
    async with collector.episode(task_id="t1") as ep:
        ...  # the agent's own code, unchanged
        ep.set_reward(1.0)
"""

import sys as _sys
from types import ModuleType as _ModuleType
from typing import TYPE_CHECKING as _TYPE_CHECKING

from tito_agents.assembly import AssemblyMode, assemble
from tito_agents.calls import Call, CallStatus
from tito_agents.collector import Collector
from tito_agents.config import (
    ErrorMode,
    OutsideEpisodeMode,
    SessionHistoryMode,
    SinkErrorMode,
)
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

_SUBPACKAGES = ("assembly", "errors", "sinks")
"""The homes of what moved out of the top level (below), which stay attributes of the package
once imported (`tito.sinks.JsonlSink`). Every other module is reached by its name
(`from tito_agents.calls import CallStatus`), never as an attribute of the package."""

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
    "ErrorMode",
    "MissingTokenIdsError",
    "OutsideEpisodeMode",
    "Sample",
    "SessionHistoryMode",
    "Sink",
    "SinkError",
    "SinkErrorMode",
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


# Like httpx, the namespace is the API: importing the modules above made each an attribute of
# the package (Python sets one per submodule it loads); every one that is not a listed
# subpackage is taken out again. `tito_agents.<module>` still resolves (`__getattr__`) for code
# that imported it by name (`import tito_agents.calls`), without being listed by `dir`.
def _hide_imported_modules() -> None:
    package = _sys.modules[__name__]
    for name, value in list(vars(package).items()):
        if isinstance(value, _ModuleType) and name[0] != "_" and name not in _SUBPACKAGES:
            delattr(package, name)


_hide_imported_modules()
del _hide_imported_modules


def __dir__() -> list[str]:
    return sorted(
        name for name in globals() if name in __all__ or name in _SUBPACKAGES or name[:2] == "__"
    )


if not _TYPE_CHECKING:  # type checkers resolve `tito_agents.<module>` from the files themselves

    def __getattr__(name: str) -> _ModuleType:
        module = _sys.modules.get(f"{__name__}.{name}")
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return module
