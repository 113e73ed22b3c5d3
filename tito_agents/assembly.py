"""Assembly: turning an episode's captured calls into samples. Pure functions, no I/O.

Per-call mode: every complete call becomes one sample, `prompt ids + sampled ids`, loss 1 exactly
on the sampled ids. Incomplete and unusable calls never become samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tito_agents.calls import Call, CallStatus
from tito_agents.samples import CallSpan, Sample, sample_id_for


def call_reward(call: Call, episode_reward: float | None) -> float | None:
    """The reward of a per-call sample: the call's own reward when set, else the episode's."""
    return call.reward if call.reward is not None else episode_reward


def per_call_sample(
    call: Call,
    *,
    episode_id: str,
    episode_reward: float | None,
    task_id: str | None = None,
    group_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Sample:
    """One complete call as one sample: the whole prompt is context, the sampled ids are trained."""
    prompt_len = int(call.prompt_ids.shape[0])
    total = prompt_len + int(call.sampled_ids.shape[0])
    token_ids = np.empty(total, dtype=np.int32)
    token_ids[:prompt_len] = call.prompt_ids
    token_ids[prompt_len:] = call.sampled_ids
    loss_mask = np.zeros(total, dtype=np.uint8)
    loss_mask[prompt_len:] = 1
    logprobs = None
    if call.logprobs is not None:
        logprobs = np.zeros(total, dtype=np.float32)
        logprobs[prompt_len:] = call.logprobs
    span = CallSpan(
        call_id=call.call_id,
        context_start=0,
        start=prompt_len,
        end=total,
        finish_reason=call.finish_reason,
        reward=call.reward,
        policy_version=call.policy_version,
    )
    meta = dict(metadata or {})
    if call.labels:
        meta["labels"] = call.labels
    return Sample(
        sample_id=sample_id_for(episode_id, [call.call_id]),
        episode_id=episode_id,
        agent=call.agent,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        reward=call_reward(call, episode_reward),
        call_ids=[call.call_id],
        spans=[span],
        task_id=task_id,
        group_id=group_id,
        model=call.model,
        start_reason="call",
        end_reason=call.finish_reason or "call",
        metadata=meta,
    )


def per_call_samples(
    calls: Iterable[Call],
    *,
    episode_id: str,
    episode_reward: float | None,
    task_id: str | None = None,
    group_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> list[Sample]:
    """Per-call samples for every complete call, in request order."""
    complete = [c for c in calls if c.status is CallStatus.COMPLETE]
    complete.sort(key=lambda c: (c.seq, c.choice_index))
    return [
        per_call_sample(
            c,
            episode_id=episode_id,
            episode_reward=episode_reward,
            task_id=task_id,
            group_id=group_id,
            metadata=metadata,
        )
        for c in complete
    ]
