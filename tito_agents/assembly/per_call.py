"""Per-call assembly: every complete call becomes one sample. Pure functions, no I/O.

A sample is `prompt ids + sampled ids`, loss 1 exactly on the sampled ids. Incomplete and unusable
calls never become samples. Exact for any agent (nothing is inferred), at the cost of repeating the
growing prompt in every sample; `merged` trades that for fewer, longer samples.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tito_agents.assembly.lineage import call_role
from tito_agents.assembly.logprob_kinds import policy_logprobs, span_flags
from tito_agents.assembly.options import EpisodeContext
from tito_agents.calls import Call, CallStatus
from tito_agents.samples import CallSpan, Sample, sample_id_for

PER_CALL_REASON = "call"
"""`Sample.start_reason` of a per-call sample (and its `end_reason` when the call has no finish)."""


def call_reward(call: Call, episode_reward: float | None) -> float | None:
    """The reward of a per-call sample: the call's own reward when set, else the episode's."""
    return call.reward if call.reward is not None else episode_reward


def sample_of_call(call: Call, episode: EpisodeContext) -> Sample:
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
        role=call_role(call),
        **span_flags(call),
    )
    meta = episode.sample_metadata("labels", call.labels)
    return Sample(
        sample_id=sample_id_for(episode.episode_id, [call.call_id]),
        episode_id=episode.episode_id,
        agent=call.agent,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        reward=call_reward(call, episode.episode_reward),
        call_ids=[call.call_id],
        spans=[span],
        task_id=episode.task_id,
        group_id=episode.group_id,
        model=call.model,
        start_reason=PER_CALL_REASON,
        end_reason=call.finish_reason or PER_CALL_REASON,
        metadata=meta,
        policy_logprobs=policy_logprobs(total, [(prompt_len, call)]),
        view="per_call",
        policy=call.policy,
    )


def assemble_per_call(calls: Iterable[Call], episode: EpisodeContext) -> list[Sample]:
    """Per-call samples for every complete call, in request order."""
    complete = [c for c in calls if c.status is CallStatus.COMPLETE]
    if len(complete) > 1:
        complete.sort(key=lambda c: (c.seq, c.choice_index))
    return [sample_of_call(c, episode) for c in complete]
