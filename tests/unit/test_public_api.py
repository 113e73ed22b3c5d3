"""The public API is small and deliberate: what `import tito_agents` offers is pinned here, and
everything moved out of it has one documented home."""

from __future__ import annotations

import importlib

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
}

HOMES = {
    "tito_agents.sinks": {"JsonlSink", "MemorySink", "CallbackSink", "BufferedSink", "open_sink"},
    "tito_agents.assembly": {
        "merged_samples",
        "assembly_report",
        "AssemblyReport",
        "Divergence",
        "DivergenceKind",
        "AssemblyOptions",
        "EpisodeContext",
        "assemble_episode",
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


def test_collector_internals_are_private() -> None:
    """Callbacks the pipeline uses between its stages are not part of the user API."""
    public = {n for n in dir(tito.Collector) if not n.startswith("_")}
    assert not public & {"finish_episode", "afinish_episode", "on_calls_recorded", "next_seq"}
