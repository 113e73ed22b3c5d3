"""The two parameter objects of assembly: whose samples they are, and how to assemble them.

`EpisodeContext` is what every sample of one episode inherits (ids, the outcome reward, labels): it
changes with each episode. `AssemblyOptions` is how samples are made (mode, reward discount, the
tokenizer hooks that name divergences): it is configuration, usually the same for a whole run. Kept
apart so per-call assembly, which needs no options, takes only the context, and so a caller builds the
options once and reuses them for every episode.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_agents.assembly.divergence import Decode
from tito_agents.config import AssemblyMode

__all__ = ["DEFAULT_OPTIONS", "AssemblyMode", "AssemblyOptions", "EpisodeContext"]


@dataclass(frozen=True, slots=True)
class EpisodeContext:
    """What every sample of one episode carries, whatever the mode."""

    episode_id: str
    episode_reward: float | None = None
    """The outcome of the whole episode (per-call: used where a call has no reward of its own;
    merged: added to each sample's discounted call rewards)."""
    task_id: str | None = None
    group_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    """Copied into each sample's `metadata` (never shared between samples)."""

    def sample_metadata(self, key: str, labels: Mapping[str, Any]) -> dict[str, Any]:
        """A sample's metadata: a copy of the episode's, with the call labels under `key`
        ("labels" per call, "call_labels" merged) when there are any. An episode metadata entry
        of that name is the user's own and is not overwritten: a dict is merged with the labels
        (the labels win per key); any other value is kept and the labels are left out (logged
        once per key)."""
        meta = dict(self.metadata or {})
        if not labels:
            return meta
        own = meta.get(key)
        if own is None:
            meta[key] = labels
        elif isinstance(own, Mapping):
            meta[key] = {**own, **labels}
        elif key not in _WARNED:
            _WARNED.add(key)
            logger.warning(
                "episode metadata %r is not a dict: kept, and the call labels that go there are "
                "left out of the samples (rename the metadata entry to keep both)",
                key,
            )
        return meta


_WARNED: set[str] = set()
logger = logging.getLogger("tito_agents")


@dataclass(frozen=True, slots=True)
class AssemblyOptions:
    """How an episode's calls become samples.

    `decode`, `special_ids` and `eos_ids` only sharpen divergence kinds and excerpts of merged
    samples; the samples' ids never depend on them. `turn_discount` is checked when merged samples
    are made (a per-call run never reads it), as before these options existed.
    """

    mode: AssemblyMode = AssemblyMode.PER_CALL
    turn_discount: float = 1.0
    """Discount of per-call rewards inside a merged sample, in [0, 1]."""
    decode: Decode | None = None
    special_ids: frozenset[int] = field(default_factory=frozenset)
    eos_ids: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def of(
        cls,
        mode: AssemblyMode | str = AssemblyMode.PER_CALL,
        *,
        turn_discount: float = 1.0,
        decode: Decode | None = None,
        special_ids: Iterable[int] | None = None,
        eos_ids: Iterable[int] | None = None,
    ) -> AssemblyOptions:
        """Options from the loose forms the keyword API accepts (a mode string, any iterables)."""
        return cls(
            mode=AssemblyMode.parse(mode),
            turn_discount=turn_discount,
            decode=decode,
            special_ids=frozenset(special_ids or ()),
            eos_ids=frozenset(eos_ids or ()),
        )

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        mode: AssemblyMode | str = AssemblyMode.PER_CALL,
        turn_discount: float = 1.0,
    ) -> AssemblyOptions:
        """Options whose divergence hooks come from a tokenizer (e.g. a transformers one): its
        `decode`, `all_special_ids` and `eos_token_id`, each used only when present."""
        if tokenizer is None:
            return cls.of(mode, turn_discount=turn_discount)
        eos = getattr(tokenizer, "eos_token_id", None)
        return cls.of(
            mode,
            turn_discount=turn_discount,
            decode=tokenizer.decode,
            special_ids=getattr(tokenizer, "all_special_ids", None),
            eos_ids=[eos] if eos is not None else None,
        )


DEFAULT_OPTIONS = AssemblyOptions()
"""Per-call mode, no reward discount, no tokenizer hooks: what `assemble` uses when given none."""
