"""Which weights sampled each call, from the engine's updates, and a `max_staleness` filter.

A chat answer carries no weight version, and the collector's `policy_version` is only the label
it held when the request was sent: during an in-place update that label can be wrong (a request
sent while the server is paused is held, then sampled by the new weights) and, with
`/pause?mode=keep`, one generation can be sampled partly by each version. `push_weights` knows
when the engine's version changed (`WeightUpdate.paused_at`, `drained_at`, `resumed_at`, on the
wall clock `Call.started_at` / `ended_at` use), so `VersionLog` reads each call's versions off
those times:

- pause "wait": vLLM finishes the requests in flight before it answers `/pause` (`drained_at`)
  and holds new ones until `/resume`: a call that ended after `drained_at` was sampled wholly by
  the new weights, one that ended before it wholly by the old. No call straddles.
- pause "keep" / "abort" / none: a call is sampled by the version live when it was sent
  (`dispatch`) and, if it ran on past the switch, by the next one (`completion`): it *straddles*
  (frozen at the pause, resumed on the new weights). Where in its tokens the switch fell the
  server does not say, so the whole call counts as its oldest version for staleness.

`filter_stale` then masks (loss 0) or drops what is older than `current - max_staleness`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tito_agents.calls import Call
from tito_agents.rl.weights import WeightUpdate
from tito_agents.samples import Sample

StaleMode = Literal["mask", "drop"]


@dataclass(frozen=True, slots=True)
class CallVersions:
    """The engine versions that sampled one call."""

    call_id: str
    label: str | None
    """The collector's `policy_version` when the request was sent (what capture recorded)."""
    dispatch: str | None
    """The version that sampled its first tokens."""
    completion: str | None
    """The version that sampled its last tokens."""

    @property
    def straddles(self) -> bool:
        """Sampled partly by each of two versions (an update with `pause="keep"` mid-call)."""
        return self.dispatch != self.completion

    @property
    def mislabelled(self) -> bool:
        """The collector's label is not the version that sampled the call's first tokens (never
        when that version is unknown: a `VersionLog` without `initial`, before its first update)."""
        return self.label is not None and self.dispatch is not None and self.label != self.dispatch


class VersionLog:
    """The engine's weight versions over time: `initial`, then one `record` per update."""

    def __init__(self, initial: str | None = None) -> None:
        self.initial = initial
        self.updates: list[WeightUpdate] = []

    def record(self, update: WeightUpdate) -> None:
        if update.drained_at is None or update.resumed_at is None:
            raise ValueError("the update carries no times (made by an older push_weights?)")
        last = self.updates[-1] if self.updates else None
        if last is not None and last.drained_at is not None and update.drained_at < last.drained_at:
            # `of_call` walks the updates in order: one recorded late would win over a newer one
            raise ValueError(
                f"update {update.version!r} happened before the last one recorded "
                f"({last.version!r}): record the updates in the order they were made"
            )
        self.updates.append(update)

    @property
    def current(self) -> str | None:
        return self.updates[-1].version if self.updates else self.initial

    def of_call(self, call: Call) -> CallVersions:
        dispatch = completion = self.initial
        # a wall clock stepped back mid-call can end it before it started: then it ran for no time
        ended = max(call.ended_at, call.started_at)
        for update in self.updates:
            switch = update.drained_at if update.drained_at is not None else 0.0
            if switch < ended:
                completion = update.version
            # "wait" drains: a call still running after it was held, so all of it is new
            if switch < (ended if update.pause == "wait" else call.started_at):
                dispatch = update.version
        return CallVersions(call.call_id, call.policy_version, dispatch, completion)

    def of_calls(self, calls: Iterable[Call]) -> dict[str, CallVersions]:
        return {call.call_id: self.of_call(call) for call in calls}


def relabel(sample: Sample, versions: Mapping[str, CallVersions]) -> Sample:
    """`sample` with each span's `policy_version` the engine version that sampled its first
    tokens (`CallVersions.dispatch`), where `versions` knows the call and that version (else the
    collector's label stays: None would say less); a new object, the input is left as it was."""
    spans = [
        dataclasses.replace(span, policy_version=versions[span.call_id].dispatch)
        if span.call_id in versions and versions[span.call_id].dispatch is not None
        else span
        for span in sample.spans
    ]
    return dataclasses.replace(sample, spans=spans)


def version_number(version: str | None) -> int | None:
    """A version label as a step number (None for no label or a non-numeric one)."""
    if version is None:
        return None
    try:
        return int(version)
    except ValueError:
        return None


def oldest_version(sample: Sample) -> str | None:
    """The policy version of the sample's oldest span (None when unlabelled): step numbers as
    `filter_stale` reads them (`version_number`), then other labels."""
    versions = [s.policy_version for s in sample.spans if s.policy_version is not None]

    def order(version: str) -> tuple[int, int, str]:
        number = version_number(version)
        return (0, number, version) if number is not None else (1, 0, version)

    return min(versions, key=order) if versions else None


@dataclass(frozen=True, slots=True)
class StalenessReport:
    """What `filter_stale` took out."""

    masked_tokens: int = 0
    """Trained tokens set to loss 0 (mode "mask")."""
    dropped_samples: int = 0
    """Samples left out (mode "drop")."""
    stale_spans: int = 0
    unversioned_spans: int = 0
    """Spans without a numeric version (kept: nothing says they are old)."""


def filter_stale(
    samples: Sequence[Sample],
    current: int | str,
    max_staleness: int,
    *,
    mode: StaleMode = "mask",
) -> tuple[list[Sample], StalenessReport]:
    """Keep what was sampled by a version no older than `current - max_staleness` steps.

    mode "mask": the loss mask is 0 on each stale span's sampled tokens (the sample stays, so
    GRPO groups and row counts do too: what a TRL `rollout_func` needs); "drop": a sample with
    any stale span is left out. Versions are read as step numbers (`version_number`)."""
    if mode not in ("mask", "drop"):
        raise ValueError(f'mode must be "mask" or "drop", got {mode!r}')
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    now = version_number(str(current))
    if now is None:
        raise ValueError(
            f"current version {current!r} is not a step number: staleness counts steps, so push "
            "the weights with integer versions (push_weights(..., version=step))"
        )
    oldest = now - max_staleness
    kept: list[Sample] = []
    masked = dropped = stale = unversioned = 0
    for sample in samples:
        old_spans = []
        for span in sample.spans:
            number = version_number(span.policy_version)
            if number is None:
                unversioned += 1
            elif number < oldest:
                old_spans.append(span)
        stale += len(old_spans)
        if not old_spans:
            kept.append(sample)
        elif mode == "drop":
            dropped += 1
        else:
            mask = np.array(sample.loss_mask, copy=True)
            for span in old_spans:
                masked += int(np.count_nonzero(mask[span.start : span.end]))
                mask[span.start : span.end] = 0
            kept.append(dataclasses.replace(sample, loss_mask=mask))
    return kept, StalenessReport(masked, dropped, stale, unversioned)
