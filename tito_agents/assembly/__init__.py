"""Assembly: an episode's captured calls become trainer-ready samples. Pure functions, no I/O.

    samples, divergences = assemble(calls, mode="merged", episode_id="ep-1", episode_reward=1.0)

One concept per module: `per_call` (one sample per call), `merged` (an agent's calls as few long
samples), `divergence` (where and why merged samples split), `report` (counts for logs), and
`options` (the two parameter objects every function here takes: `EpisodeContext`, whose samples they
are, and `AssemblyOptions`, how to make them). The keyword functions (`assemble`, `merged_samples`,
`per_call_samples`) build those objects and call the `assemble_*` functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tito_agents.assembly.divergence import END, EPISODE_START, Decode, Divergence, DivergenceKind
from tito_agents.assembly.merged import assemble_merged, merged_reward, merged_samples
from tito_agents.assembly.options import AssemblyMode, AssemblyOptions, EpisodeContext
from tito_agents.assembly.per_call import (
    assemble_per_call,
    call_reward,
    per_call_sample,
    per_call_samples,
)
from tito_agents.assembly.report import AssemblyReport, assembly_report
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
    "assemble_episode",
    "assemble_merged",
    "assemble_per_call",
    "assembly_report",
    "call_reward",
    "merged_reward",
    "merged_samples",
    "per_call_sample",
    "per_call_samples",
]


def assemble(
    calls: Iterable[Call],
    *,
    mode: AssemblyMode | str = AssemblyMode.PER_CALL,
    episode_id: str,
    episode_reward: float | None,
    task_id: str | None = None,
    group_id: str | None = None,
    metadata: dict[str, Any] | None = None,
    turn_discount: float = 1.0,
    decode: Decode | None = None,
    special_ids: Iterable[int] | None = None,
    eos_ids: Iterable[int] | None = None,
) -> tuple[list[Sample], list[Divergence]]:
    """An episode's samples in the chosen mode: "per_call", "merged" or "both" (per-call first).

    Keyword form of `assemble_episode`; `mode` is an `AssemblyMode` or its string (another string
    raises `ValueError`). Per-call mode reports no divergences. `turn_discount`, `decode`,
    `special_ids` and `eos_ids` only apply to merged samples.
    """
    options = AssemblyOptions.of(
        mode, turn_discount=turn_discount, decode=decode, special_ids=special_ids, eos_ids=eos_ids
    )
    episode = EpisodeContext(episode_id, episode_reward, task_id, group_id, metadata)
    return assemble_episode(calls, episode, options)


def assemble_episode(
    calls: Iterable[Call], episode: EpisodeContext, options: AssemblyOptions
) -> tuple[list[Sample], list[Divergence]]:
    """An episode's samples in `options.mode` (per-call first in mode "both"), and the divergences
    found while merging (none in per-call mode)."""
    calls = list(calls)  # read once per mode
    samples: list[Sample] = []
    divergences: list[Divergence] = []
    if options.mode.per_call:
        samples.extend(assemble_per_call(calls, episode))
    if options.mode.merged:
        merged, divergences = assemble_merged(calls, episode, options)
        samples.extend(merged)
    return samples, divergences
