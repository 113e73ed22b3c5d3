"""The public API is small and deliberate: what `import tito_agents` offers is pinned here, and
everything moved out of it has one documented home."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import tito_agents as tito

TOP_LEVEL = {
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
}

HOMES = {
    "tito_agents.sinks": {"JsonlSink", "MemorySink", "CallbackSink", "BufferedSink", "open_sink"},
    "tito_agents.assembly": {
        "assemble",
        "assemble_merged",
        "assemble_per_call",
        "sample_of_call",
        "assembly_report",
        "AssemblyReport",
        "Divergence",
        "DivergenceKind",
        "AssemblyOptions",
        "EpisodeContext",
    },
    "tito_agents.errors": {
        "IncompleteCallError",
        "MalformedResponseError",
        "OutsideEpisodeError",
        "SampleFormatError",
        "TokenCountMismatchError",
    },
    "tito_agents.integration": {
        "Attribution",
        "ContextThreadPoolExecutor",
        "register_resolver",
        "unregister_resolver",
        "current_agent",
    },
}


def test_top_level_names_are_exactly_the_user_api() -> None:
    """A name added to or dropped from `tito_agents.__all__` is a decision: change this list."""
    assert set(tito.__all__) == TOP_LEVEL
    for name in tito.__all__:
        assert getattr(tito, name) is not None


def test_every_moved_name_has_its_home() -> None:
    for module_name, names in HOMES.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert hasattr(module, name), f"{module_name}.{name}"


def test_one_name_and_one_form_each() -> None:
    """Each assembly function has one form (an `EpisodeContext` and `AssemblyOptions`, no keyword
    twin), each choice enum is a `...Mode` ("policy" names only the RL policy), and the collector's
    settings are read on `collector.settings` only (no forwarding properties)."""
    import tito_agents.assembly as assembly

    twins = {"assemble_episode", "merged_samples", "per_call_samples", "per_call_sample"}
    assert not twins & set(dir(assembly))
    assert assembly.assemble is tito.assemble
    old_names = {"OutsideEpisode", "SinkErrors", "SessionHistory"}
    assert not old_names & set(dir(tito))
    assert not {name for name in dir(tito) if name.endswith("Policy")}
    modes = {name for name in tito.__all__ if name.endswith("Mode")}
    assert modes == {
        "AssemblyMode",
        "ErrorMode",
        "OutsideEpisodeMode",
        "SessionHistoryMode",
        "SinkErrorMode",
    }
    settings = {"policy_version", "assembly", "turn_discount", "tokenizer", "errors"}
    assert not settings & set(dir(tito.Collector))


PUBLIC_SUBPACKAGES = {"assembly", "errors", "sinks"}
"""Homes of names moved out of the top level, which stay attributes of the package."""

_NAMESPACE = """
import json, tito_agents as tito
print(json.dumps({"vars": sorted(vars(tito)), "dir": dir(tito),
                  "annotations": hasattr(tito, "annotations")}))
"""


def _fresh_namespace() -> dict[str, Any]:
    """The package's namespace right after `import tito_agents`, in a fresh interpreter (other
    tests import submodules, which Python then sets as attributes of the package)."""
    done = subprocess.run(
        [sys.executable, "-c", _NAMESPACE], check=True, capture_output=True, text=True
    )
    namespace: dict[str, Any] = json.loads(done.stdout)
    return namespace


def test_the_namespace_is_the_api() -> None:
    """As in httpx: `__all__` (sorted) is every public name of the package, and every other
    attribute is a dunder, an underscored internal or a listed subpackage. No `annotations`
    (a `from __future__` import) and no module loaded on the way (`calls`, `config`, ...)."""
    assert tito.__all__ == sorted(tito.__all__)
    namespace = _fresh_namespace()
    public = {name for name in namespace["vars"] if not name.startswith("_")}
    assert public == (set(tito.__all__) - {"__version__"}) | PUBLIC_SUBPACKAGES
    listed = {name for name in namespace["dir"] if not name.startswith("__")}
    assert listed == (set(tito.__all__) - {"__version__"}) | PUBLIC_SUBPACKAGES
    assert namespace["annotations"] is False


def test_modules_stay_reachable_by_name() -> None:
    """A module taken out of the namespace is still `tito_agents.<module>` for code that imports
    it by name (`import tito_agents.calls`), as before."""
    import tito_agents.calls
    import tito_agents.config

    assert tito_agents.calls.Call is tito.Call
    assert tito_agents.config.ErrorMode is tito.ErrorMode
    assert not hasattr(tito, "no_such_module")
