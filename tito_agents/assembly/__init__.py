"""Assembly: an episode's captured calls become trainer-ready samples. Pure functions, no I/O.

    episode = EpisodeContext("ep-1", episode_reward=1.0)
    samples, divergences = assemble(calls, episode, AssemblyOptions.of("merged"))

One concept per module: `per_call` (one sample per call), `merged` (an agent's calls as few long
samples), `divergence` (where and why merged samples split), `report` (counts for logs), and
`options` (the two parameter objects every function here takes: `EpisodeContext`, whose samples they
are, and `AssemblyOptions`, how to make them; per-call assembly needs no options). One function per
job: `assemble` (the mode chooses), `assemble_per_call`, `assemble_merged`, `sample_of_call`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tito_agents.assembly.divergence import END, EPISODE_START, Decode, Divergence, DivergenceKind
from tito_agents.assembly.merged import assemble_merged
from tito_agents.assembly.options import (
    DEFAULT_OPTIONS,
    AssemblyMode,
    AssemblyOptions,
    EpisodeContext,
)
from tito_agents.assembly.per_call import assemble_per_call, call_reward, sample_of_call
from tito_agents.assembly.report import AssemblyReport, assembly_report
from tito_agents.assembly.rewards import merged_reward
from tito_agents.calls import Call
from tito_agents.samples import Sample

__all__ = [
    "END",
    "EPISODE_START",
    "AssemblyMode",
    "AssemblyOptions",
    "AssemblyReport",
    "Decode",
    "Divergence",
    "DivergenceKind",
    "EpisodeContext",
    "assemble",
    "assemble_merged",
    "assemble_per_call",
    "assembly_report",
    "call_reward",
    "merged_reward",
    "sample_of_call",
]


def assemble(
    calls: Iterable[Call], episode: EpisodeContext, options: AssemblyOptions = DEFAULT_OPTIONS
) -> tuple[list[Sample], list[Divergence]]:
    """An episode's samples in `options.mode` ("per_call" by default; per-call first in mode
    "both"), and the divergences found while merging (none in per-call mode)."""
    calls = list(calls)  # read once per mode
    samples: list[Sample] = []
    divergences: list[Divergence] = []
    if options.mode.per_call:
        samples.extend(assemble_per_call(calls, episode))
    if options.mode.merged:
        merged, divergences = assemble_merged(calls, episode, options)
        samples.extend(merged)
    return samples, divergences
