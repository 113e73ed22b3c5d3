"""Builders for the `tito_agents.rl.versions` tests: a weight update with its times, a call
as `VersionLog` reads it, and a merged sample with one span per version label."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tito_agents.rl import WeightUpdate
from tito_agents.samples import CallSpan, Sample


def update(version: str, pause: Any, paused: float, drained: float, resumed: float) -> WeightUpdate:
    return WeightUpdate(
        version=version,
        previous=None,
        weights_path=Path("w"),
        save_s=0.0,
        reload_s=resumed - paused,
        pause=pause,
        paused_at=paused,
        drained_at=drained,
        resumed_at=resumed,
    )


def call(call_id: str, started: float, ended: float, label: str | None = "0") -> Any:
    return SimpleNamespace(
        call_id=call_id, started_at=started, ended_at=ended, policy_version=label
    )


def sample(versions: list[str | None]) -> Sample:
    """One merged sample: per call two context tokens, then three sampled ones."""
    spans, token_ids = [], []
    for i, version in enumerate(versions):
        base = 5 * i
        spans.append(CallSpan(f"c{i}", base, base + 2, base + 5, policy_version=version))
        token_ids += [1, 2, 3, 4, 5]
    mask = np.zeros(len(token_ids), dtype=np.uint8)
    for span in spans:
        mask[span.start : span.end] = 1
    return Sample(
        sample_id="s",
        episode_id="e",
        agent=None,
        token_ids=np.asarray(token_ids, dtype=np.int64),
        loss_mask=mask,
        logprobs=None,
        reward=1.0,
        call_ids=[s.call_id for s in spans],
        spans=spans,
        view="merged",
    )
