"""Merged assembly: an agent's calls as few long samples, split only where a prompt rewrites history.

Pure functions, no I/O. `assemble_merged` turns an episode's calls into samples and the divergences
that split them; `tito_agents.assembly.report` summarises both and `tito_agents.assembly.assemble`
picks per-call, merged or both.

Grouping and order
    Only complete calls (`CallStatus.COMPLETE`) are used, grouped by `agent` (None is a group of its
    own) and taken in request order `(seq, choice_index)`. A call id seen twice is used once.

Chains (one chain = one sample)
    A chain's *tip* is its last call's prompt ids + sampled ids, which are exactly the sample's
    `token_ids`. A call whose prompt starts with a chain's tip *extends* it: the rest of the prompt
    (tool results, user turns, template glue) is appended with loss 0, then the call's sampled ids with
    loss 1. When several tips fit, the longest wins (ties: the chain extended most recently). Every
    chain stays open, so a call can continue any branch, not only the latest one.

Divergence (the rewrite point)
    A call that extends no tip starts a new chain: its whole prompt is context (loss 0) and only its
    own sampled ids are trained. Nothing is lost: the chain it left keeps its ids as a sample of its
    own, so every sampled token of the episode is trained in exactly one sample. Its *parent* is the
    chain whose tip shares the longest common prefix with the prompt (ties, e.g. `n > 1` siblings:
    the chain whose ids after that prefix reappear most in the prompt, i.e. the sibling the agent
    continued, then the most recent). The rewrite point is that prefix length, and
    `tito_agents.assembly.divergence` names the kind, first match wins: `RESAMPLE` (the prompt equals the
    prompt of an earlier call of the agent, in any chain: retries and `n > 1` choices become sibling
    samples, all kept), `BRANCH` (the call was sent before the parent's last call returned and holds
    none of its sampled ids: a parallel sub-call), then `TRUNCATION`, `RETOKENIZED`,
    `TEMPLATE_RERENDER`, `HISTORY_REWRITE`, `OTHER`. Branching from an earlier point of the history
    (backtracking) is a divergence like any other: same samples, the kind says where the prompt left
    the history.

One policy per sample
    A sample is trained on one policy (`Sample.policy`: the model / LoRA adapter the calls went to).
    A call that extends a tip but went to another policy than the chain's last call starts a new
    chain all the same: `POLICY_SWITCH` (rewrite point = the whole tip), or the kind of rewrite
    when another chain shares a longer prefix with the prompt (the extended chain was left behind
    earlier). Its prompt is context, its sampled ids are trained there. A chain left by a switch is
    continued by the new one: no later call extends it (a rewrite of the new one is diagnosed).

Reasons
    `start_reason` is `"episode_start"` for an agent's first sample, else the kind of the divergence
    that started it (`"retokenized"`, `"resample"`, ...). `end_reason` is the kind of the last divergence
    that left the chain after its last call, or `"end"` when none did.

Rewards
    `reward = episode_reward + sum_k turn_discount**k * r_k`, over the sample's calls k = 0, 1, ... in
    order, where `r_k` is the call's own reward (unset counts 0). The episode reward is the outcome of
    the whole episode, shared undiscounted by every sample (like a rollout-level advantage); per-call
    rewards are discounted from the sample's first call (the return seen from where the sample starts).
    The reward is None only when the episode reward and every call reward are unset. Unlike per-call
    mode (a call's reward replaces the episode's), the two add up. Each `CallSpan` keeps the call's own
    reward, policy version and finish reason, so a token-level trainer can put `r_k` at `span.end - 1`.

Logprobs
    A sample has logprobs when every call in it has them (one per sampled id): the rollout logprob at
    trained positions, 0.0 elsewhere. Otherwise `logprobs` is None rather than a made-up value.

Sample ids
    `sample_id_for(episode_id, call_ids, salt="merged")`: deterministic, and never equal to a per-call
    sample id, so mode "both" can write both kinds to one sink.

Lineage
    An agent's samples are the segments of one trajectory (`trajectory_id`, `segment_index`,
    `prev_sample_id`), and each segment started by a rewrite names it (`rewrite`); see
    `tito_agents.assembly.lineage`, which also recognises summarising calls (`CallSpan.role`).

Cost: O(total prompt + sampled ids) numpy comparisons, one concatenation per sample, Python work per
call, not per token; each divergence looks at a bounded window after its rewrite point.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tito_agents.assembly.divergence import (
    END,
    EPISODE_START,
    TEXT_WINDOW_TOKENS,
    Divergence,
    DivergenceKind,
    classify_rewrite,
    common_prefix_len,
    excerpt,
)
from tito_agents.assembly.lineage import call_role, link_segments, segment_rewrite
from tito_agents.assembly.logprob_kinds import policy_logprobs, span_flags
from tito_agents.assembly.options import DEFAULT_OPTIONS, AssemblyOptions, EpisodeContext
from tito_agents.assembly.rewards import check_discount, merged_reward
from tito_agents.calls import Call, CallStatus, IdArray
from tito_agents.samples import (
    SUMMARIZER_ROLE,
    CallSpan,
    Sample,
    finite_or_none,
    sample_id_for,
)

MERGED_SALT = "merged"
"""Salt of merged sample ids: never equal to a per-call sample id of the same calls."""
_REUSE_WINDOW = 256


@dataclass(slots=True)
class _Chain:
    """One growing sample of one agent. Its tip is `calls[-1].prompt_ids + calls[-1].sampled_ids`."""

    calls: list[Call]
    context_starts: list[int]
    starts: dict[int, int]
    """Start of each call's sampled ids -> index in `calls` (finds resamples)."""
    start_reason: str
    tip_len: int
    tip_last: int
    touched: int
    end_reason: str = END
    continued: bool = False
    """Left by a policy switch: the next chain holds this tip, so no call extends it any more."""

    @classmethod
    def first(cls, call: Call, start_reason: str, clock: int) -> _Chain:
        chain = cls([], [], {}, start_reason, 0, -1, clock)
        chain.append(call, clock)
        return chain

    def append(self, call: Call, clock: int) -> None:
        start = int(call.prompt_ids.shape[0])
        self.context_starts.append(self.tip_len)
        self.starts.setdefault(start, len(self.calls))
        self.calls.append(call)
        self.tip_len = start + int(call.sampled_ids.shape[0])
        tip = call.sampled_ids if call.sampled_ids.size else call.prompt_ids
        self.tip_last = int(tip[-1]) if tip.size else -1
        self.touched = clock
        self.end_reason = END

    def extended_by(self, prompt_ids: IdArray) -> bool:
        """Whether `prompt_ids` starts with this chain's tip."""
        tip_len = self.tip_len
        if tip_len > prompt_ids.shape[0]:
            return False
        if tip_len and int(prompt_ids[tip_len - 1]) != self.tip_last:
            return False  # O(1) reject: most non-matching tips differ in their last id
        last = self.calls[-1]
        head = int(last.prompt_ids.shape[0])
        # The short sampled span first: a chain left behind by a divergence usually fails there.
        return bool(
            np.array_equal(prompt_ids[head:tip_len], last.sampled_ids)
            and np.array_equal(prompt_ids[:head], last.prompt_ids)
        )

    def common_prefix(self, prompt_ids: IdArray) -> int:
        """Longest common prefix of `prompt_ids` and the tip."""
        last = self.calls[-1]
        k = common_prefix_len(prompt_ids, last.prompt_ids)
        if k < last.prompt_ids.shape[0]:
            return k
        return k + common_prefix_len(prompt_ids[k:], last.sampled_ids)

    def tail(self, position: int, limit: int | None = None) -> IdArray:
        """The tip's ids from `position` on (at most `limit` of them)."""
        last = self.calls[-1]
        head = int(last.prompt_ids.shape[0])
        if position >= head:
            return last.sampled_ids[position - head :][:limit]
        if limit is not None and position + limit <= head:
            return last.prompt_ids[position : position + limit]
        return np.concatenate((last.prompt_ids[position:], last.sampled_ids))[:limit]


@dataclass(slots=True)
class _Break:
    call: Call
    prev_call: Call
    parent: _Chain
    child: _Chain
    rewrite_point: int
    kind: DivergenceKind
    excerpt: str
    rewrite: str | None = None
    summarizer: str | None = None
    """An unlabelled call recognised as the summariser by its ids (`lineage.summarizer_before`)."""


def assemble_merged(
    calls: Iterable[Call], episode: EpisodeContext, options: AssemblyOptions = DEFAULT_OPTIONS
) -> tuple[list[Sample], list[Divergence]]:
    """Merged samples of an episode's complete calls, and the divergences that split them.

    Samples come in order of their first call, divergences in order of the diverging call
    (`options.mode` is not read: the caller chose merged). `options.decode`, `special_ids` and
    `eos_ids` only sharpen the divergence kinds and excerpts; the samples' ids never depend on
    them. See the module docstring for the rules.
    """
    discount = check_discount(options.turn_discount)
    episode_reward = finite_or_none(episode.episode_reward)
    groups: dict[str | None, list[Call]] = {}
    seen: set[str] = set()
    complete = sorted(
        (c for c in calls if c.status is CallStatus.COMPLETE), key=lambda c: (c.seq, c.choice_index)
    )
    for call in complete:
        if call.call_id not in seen:
            seen.add(call.call_id)
            groups.setdefault(call.agent, []).append(call)

    chains: list[_Chain] = []
    breaks: list[_Break] = []
    for agent_calls in groups.values():
        _chain_agent(agent_calls, options, chains, breaks)

    chains.sort(key=lambda ch: (ch.calls[0].seq, ch.calls[0].choice_index))
    summarizers = {b.summarizer for b in breaks if b.summarizer is not None}
    samples: list[Sample] = []
    sample_ids: dict[int, str] = {}
    for chain in chains:
        sample = _chain_sample(chain, episode, episode_reward, discount, summarizers)
        sample_ids[id(chain)] = sample.sample_id
        samples.append(sample)
    link_segments(samples, episode.episode_id, {sample_ids[id(b.child)]: b.rewrite for b in breaks})
    rewrites = {s.sample_id: s.rewrite for s in samples}

    breaks.sort(key=lambda b: (b.call.seq, b.call.choice_index))
    divergences = [
        Divergence(
            episode_id=episode.episode_id,
            agent=b.call.agent,
            call_id=b.call.call_id,
            prev_call_id=b.prev_call.call_id,
            rewrite_point=b.rewrite_point,
            kind=b.kind,
            excerpt=b.excerpt,
            sample_id=sample_ids[id(b.child)],
            prev_sample_id=sample_ids[id(b.parent)],
            rewrite=rewrites[sample_ids[id(b.child)]],
        )
        for b in breaks
    ]
    return samples, divergences


def _chain_agent(
    calls: list[Call], options: AssemblyOptions, out_chains: list[_Chain], out_breaks: list[_Break]
) -> None:
    """Split one agent's ordered calls into chains, recording a break for each new chain but the first."""
    chains: list[_Chain] = []
    # n > 1 choices share one prompt array object: their resamples are found without comparing ids.
    by_prompt_object: dict[int, tuple[_Chain, Call]] = {}
    for clock, call in enumerate(calls):
        prompt_ids = call.prompt_ids
        chain = _extended_chain(chains, prompt_ids)
        found: _Break | None = None
        if chain is None and chains:
            found = _diagnose(call, chains, by_prompt_object.get(id(prompt_ids)), options)
        elif chain is not None and chain.calls[-1].policy != call.policy:
            # Another policy: a new sample either way. A switch from `chain`, unless another
            # chain shares a longer prefix (`chain` is stale, the history it left was rewritten).
            found = _diagnose(call, chains, by_prompt_object.get(id(prompt_ids)), options)
            if found.rewrite_point <= chain.tip_len:
                found = _policy_switch(call, chain)
                chain.continued = True
        if chain is not None and found is None:
            chain.append(call, clock)
        else:
            chain = _Chain.first(call, EPISODE_START if found is None else found.kind.value, clock)
            chains.append(chain)
        if found is not None:
            found.parent.end_reason = found.kind.value
            found.child = chain
            out_breaks.append(found)
        by_prompt_object.setdefault(id(prompt_ids), (chain, call))
    out_chains.extend(chains)


def _extended_chain(chains: list[_Chain], prompt_ids: IdArray) -> _Chain | None:
    """The chain whose tip the prompt extends: the longest tip, ties to the latest touched."""
    best: _Chain | None = None
    for chain in chains:
        if chain.continued:
            continue
        if best is not None and (chain.tip_len, chain.touched) < (best.tip_len, best.touched):
            continue
        if chain.extended_by(prompt_ids):
            best = chain
    return best


def _diagnose(
    call: Call,
    chains: list[_Chain],
    same_prompt: tuple[_Chain, Call] | None,
    options: AssemblyOptions,
) -> _Break:
    """Parent chain, compared call, rewrite point, kind, excerpt and rewrite of a call that extends
    no tip (its `child` is set by the caller)."""
    prompt_ids = call.prompt_ids
    n = int(prompt_ids.shape[0])
    resample = same_prompt
    parent: _Chain | None = None
    point = -1
    if resample is None:
        tied: list[_Chain] = []
        for chain in chains:
            lcp = chain.common_prefix(prompt_ids)
            if lcp == n and resample is None and n in chain.starts:
                resample = (chain, chain.calls[chain.starts[n]])
            if lcp > point:
                point, tied = lcp, [chain]
            elif lcp == point:
                tied.append(chain)
        parent = (
            max(
                tied,
                key=lambda ch: (
                    _reuse(ch.tail(point, _REUSE_WINDOW), prompt_ids[point:]),
                    ch.touched,
                ),
            )
            if len(tied) > 1
            else tied[0]
        )
    if resample is not None:
        chain, prev_call = resample
        text = excerpt(prompt_ids, n, prev_call.sampled_ids, call.sampled_ids, options.decode)
        return _Break(call, prev_call, chain, chain, n, DivergenceKind.RESAMPLE, text)
    assert parent is not None  # chains is not empty
    prev_call = parent.calls[-1]
    # Classification looks at a bounded window after the rewrite point (one more id says "cut").
    old_tail = parent.tail(point, TEXT_WINDOW_TOKENS + 1)
    new_tail = prompt_ids[point:]
    last_start = int(prev_call.prompt_ids.shape[0])
    if call.started_at < prev_call.ended_at and point <= last_start:
        kind = DivergenceKind.BRANCH  # sent before `prev_call` returned, and holds none of its ids
    else:
        kind = classify_rewrite(
            old_tail,
            new_tail,
            rewrite_point=point,
            last_start=last_start,
            last_end=parent.tip_len,
            last_finish_reason=prev_call.finish_reason,
            last_sampled_ids=prev_call.sampled_ids,
            decode=options.decode,
            special_ids=options.special_ids,
            eos_ids=options.eos_ids,
        )
    text = excerpt(prompt_ids, point, old_tail, new_tail, options.decode)
    rewrite, inferred = segment_rewrite(call, chains, parent, kind, old_tail, new_tail, options)
    return _Break(call, prev_call, parent, parent, point, kind, text, rewrite, inferred)


def _policy_switch(call: Call, parent: _Chain) -> _Break:
    """The break of a call that extends `parent`'s tip but went to another policy."""
    prev_call = parent.calls[-1]
    text = f"policy {prev_call.policy!r} -> {call.policy!r}"
    return _Break(
        call, prev_call, parent, parent, parent.tip_len, DivergenceKind.POLICY_SWITCH, text
    )


def _reuse(old_ids: IdArray, new_ids: IdArray) -> int:
    """How many of the old ids reappear in the new prompt's next ids: which sibling was continued."""
    pool = set(new_ids[: 4 * _REUSE_WINDOW].tolist())
    return sum(1 for token in old_ids[:_REUSE_WINDOW].tolist() if token in pool)


def _chain_sample(
    chain: _Chain,
    episode: EpisodeContext,
    episode_reward: float | None,
    discount: float,
    summarizers: set[str],
) -> Sample:
    """The sample of a finished chain: one concatenation for the ids, one slice write per call.

    `episode_reward` and `discount` come checked from `assemble_merged` (once per episode, not per
    sample), which is why they travel beside `episode`.
    """
    episode_id = episode.episode_id
    last = chain.calls[-1]
    token_ids = np.concatenate((last.prompt_ids, last.sampled_ids), dtype=np.int32)
    total = int(token_ids.shape[0])
    loss_mask = np.zeros(total, dtype=np.uint8)
    with_logprobs = all(
        c.logprobs is not None and c.logprobs.shape == c.sampled_ids.shape for c in chain.calls
    )
    logprobs = np.zeros(total, dtype=np.float32) if with_logprobs else None
    spans: list[CallSpan] = []
    for call, context_start in zip(chain.calls, chain.context_starts, strict=True):
        start = int(call.prompt_ids.shape[0])
        end = start + int(call.sampled_ids.shape[0])
        loss_mask[start:end] = 1
        if logprobs is not None and call.logprobs is not None:
            logprobs[start:end] = call.logprobs
        spans.append(
            CallSpan(
                call_id=call.call_id,
                context_start=context_start,
                start=start,
                end=end,
                finish_reason=call.finish_reason,
                reward=call.reward,
                policy_version=call.policy_version,
                role=SUMMARIZER_ROLE if call.call_id in summarizers else call_role(call),
                **span_flags(call),
            )
        )
    call_ids = [c.call_id for c in chain.calls]
    meta = episode.sample_metadata(
        "call_labels", {c.call_id: c.labels for c in chain.calls if c.labels}
    )
    return Sample(
        sample_id=sample_id_for(episode_id, call_ids, salt=MERGED_SALT),
        episode_id=episode_id,
        agent=last.agent,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        reward=merged_reward([c.reward for c in chain.calls], episode_reward, discount),
        call_ids=call_ids,
        spans=spans,
        task_id=episode.task_id,
        group_id=episode.group_id,
        model=next((c.model for c in chain.calls if c.model is not None), None),
        start_reason=chain.start_reason,
        end_reason=chain.end_reason,
        metadata=meta,
        policy_logprobs=policy_logprobs(
            total, [(int(c.prompt_ids.shape[0]), c) for c in chain.calls]
        ),
        view="merged",
        policy=next((c.policy for c in chain.calls if c.policy is not None), None),
    )
