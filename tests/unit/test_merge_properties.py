"""Property tests of merged assembly over random multi-agent episodes with injected divergences.

Each generated agent runs a toy ChatML conversation; between turns the re-render of the last completion
may be exact, retokenized, stripped of its reasoning block, edited, re-rendered after a truncation, or
the history may be trimmed; calls may be resampled (retry, `n > 1`) or fanned out in parallel.
Incomplete calls and re-delivered call ids are mixed in. The generator knows which kind each injected
divergence is, so classification is checked too.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.toy_chatml import (
    END_THINK,
    EOS_IDS,
    HEADER,
    IM_END,
    LETTER0,
    NL,
    NUM_MARKERS,
    PAIR0,
    SPECIAL_IDS,
    SYSTEM,
    THINK,
    TOOL,
    USER,
    decode,
    is_pair,
    marker,
    message,
    split_pair,
    toy_call,
)
from tito_agents.assembly import AssemblyOptions, Divergence, EpisodeContext, assemble_merged
from tito_agents.assembly.divergence import DivergenceKind, common_prefix_len
from tito_agents.calls import Call, CallStatus
from tito_agents.samples import Sample

K = DivergenceKind
WORD = st.integers(LETTER0, PAIR0 + 26 * 26 - 1)  # letters and letter pairs
IDS_ONLY = {K.RETOKENIZED: K.OTHER}
BARE = {K.RETOKENIZED: K.OTHER, K.TEMPLATE_RERENDER: K.OTHER}


@dataclass
class Episode:
    calls: list[Call] = field(default_factory=list)
    expected: dict[str, tuple[DivergenceKind, Call | None]] = field(default_factory=dict)
    """Per diverging call id: the injected kind (as classified with decode and special ids) and the
    call it re-renders (None for resamples and branches)."""


@dataclass
class Completion:
    call: Call
    kind: str  # "plain" | "think" | "truncated"
    think_len: int  # length of the <think>…</think> block at the start (0 if none)


class AgentSim:
    """One agent's conversation: `messages` is the history before the current completion."""

    def __init__(self, draw: st.DrawFn, agent: str | None, ids: list[int]) -> None:
        self.draw = draw
        self.agent = agent
        self.ids = ids  # shared counters: [next call number, next marker]
        self.clock = 0.0
        self.units: list[list[Call]] = []
        self.expected: dict[str, tuple[DivergenceKind, Call | None]] = {}
        self.messages = [self.message(SYSTEM), self.message(USER)]

    # -- building blocks --

    def fresh_marker(self) -> int:
        self.ids[1] += 1
        assert self.ids[1] < NUM_MARKERS
        return marker(self.ids[1])

    def message(self, role: int) -> list[int]:
        content = self.draw(st.lists(WORD, max_size=3))
        return message(role, self.fresh_marker(), *content)

    def completion_ids(self) -> tuple[list[int], str, int]:
        kind = self.draw(st.sampled_from(["plain", "plain", "think", "truncated"]))
        body = [self.fresh_marker(), *self.draw(st.lists(WORD, min_size=2, max_size=5))]
        if kind == "truncated":
            return body, kind, 0
        think = []
        if kind == "think":
            think = [THINK, *self.draw(st.lists(WORD, max_size=3)), END_THINK]
        return [*think, *body, IM_END], kind, len(think)

    def new_call(
        self,
        prompt: np.ndarray,
        sampled: list[int],
        finish: str,
        choice: int,
        seq: int,
        started: float,
        ended: float,
    ) -> Call:
        self.ids[0] += 1
        call = toy_call(
            f"r{self.ids[0]}/{choice}",
            prompt,
            sampled,
            seq=seq,
            choice=choice,
            agent=self.agent,
            finish=finish,
            started=started,
            ended=ended,
            reward=self.draw(st.none() | st.floats(-1, 1, allow_nan=False)),
            logprobs=self.draw(st.integers(0, 9)) > 0,
            policy_version=self.draw(st.sampled_from([None, "v1", "v2"])),
        )
        call.seq = -1  # assigned when the units are interleaved
        return call

    def request(
        self,
        prompt: list[int],
        expected: DivergenceKind | None,
        started: float | None = None,
        after: Call | None = None,
    ) -> list[Completion]:
        """One request (1-3 choices sharing one prompt array); returns its completions."""
        prompt_ids = np.array(prompt, dtype=np.int32)
        n = self.draw(st.sampled_from([1, 1, 1, 2, 3]))
        started = self.clock if started is None else started
        ended = started + 3.0
        self.clock = max(self.clock, ended + 1.0)
        out = []
        for choice in range(n):
            sampled, kind, think_len = self.completion_ids()
            finish = "length" if kind == "truncated" else "stop"
            call = self.new_call(prompt_ids, sampled, finish, choice, -1, started, ended)
            out.append(Completion(call, kind, think_len))
            if choice == 0 and expected is not None:
                self.expected[call.call_id] = (expected, after)
            elif choice > 0:
                self.expected[call.call_id] = (K.RESAMPLE, None)
        self.units.append([c.call for c in out])
        return out

    # -- re-renders of the current completion --

    @staticmethod
    def exact(c: Completion) -> list[int]:
        sampled = c.call.sampled_ids.tolist()
        return [*sampled, IM_END, NL] if c.kind == "truncated" else [*sampled, NL]

    def retokenized(self, c: Completion) -> list[int]:
        body = c.call.sampled_ids.tolist()
        for i, token in enumerate(body):
            if is_pair(token):
                return [*body[:i], *split_pair(token), *body[i + 1 :], NL]
        for i in range(1, len(body) - 1):  # two letters in a row (after the marker) merge
            a, b = body[i], body[i + 1]
            if LETTER0 <= a < PAIR0 and LETTER0 <= b < PAIR0:
                merged = PAIR0 + 26 * (a - LETTER0) + (b - LETTER0)
                return [*body[:i], merged, *body[i + 2 :], NL]
        raise AssertionError("completions always hold a pair or two letters")

    def step(self, current: Completion) -> Completion:
        """One more turn after `current`; returns the completion the agent continues from."""
        actions = ["extend", "extend", "history", "resample", "parallel"]
        actions += {
            "plain": ["retokenize", "edit"],
            "think": ["drop_think", "edit"],
            "truncated": ["truncation"],
        }[current.kind]
        action = self.draw(st.sampled_from(actions))
        if action == "resample":
            retry = self.request(current.call.prompt_ids.tolist(), K.RESAMPLE)
            return self.draw(st.sampled_from([current, *retry]))
        rendered = self.exact(current)
        expected: DivergenceKind | None = None
        history = list(self.messages)
        if action == "retokenize":
            rendered, expected = self.retokenized(current), K.RETOKENIZED
        elif action == "drop_think":
            rendered = rendered[current.think_len :]
            expected = K.TEMPLATE_RERENDER
        elif action == "edit":
            at = current.think_len  # the completion's marker
            rendered = [*rendered[:at], self.fresh_marker(), *rendered[at + 1 :]]
            expected = K.OTHER
        elif action == "truncation":
            rendered = [*current.call.sampled_ids.tolist()[:-1], IM_END, NL]
            expected = K.TRUNCATION
        elif action == "history":
            if self.draw(st.booleans()):
                del history[1]  # memory trimming: the oldest message after the system prompt
            else:
                history[0] = self.message(SYSTEM)  # the system prompt changed
            expected = K.HISTORY_REWRITE
        assistant = [*HEADER, *rendered]
        if action == "parallel":
            obs = [self.message(self.draw(st.sampled_from([USER, TOOL]))) for _ in range(2)]
            prompts = [_flat(history) + assistant + o + HEADER for o in obs]
            t = self.clock
            first = self.request(prompts[0], None, started=t)
            # The second request leaves while the first is still in flight.
            second = self.request(prompts[1], K.BRANCH, started=t + 1.0)
            pick = self.draw(st.integers(0, 1))
            self.messages = [*history, assistant, obs[pick]]
            return self.draw(st.sampled_from(first if pick == 0 else second))
        observation = self.message(self.draw(st.sampled_from([USER, TOOL])))
        self.messages = [*history, assistant, observation]
        done = self.request(_flat(self.messages) + HEADER, expected, after=current.call)
        return self.draw(st.sampled_from(done))

    def run(self, turns: int) -> None:
        current = self.draw(st.sampled_from(self.request(_flat(self.messages) + HEADER, None)))
        for _ in range(turns):
            if self.draw(st.integers(0, 9)) == 0:  # noise: a call that never becomes a sample
                junk = self.draw(st.lists(WORD, min_size=1, max_size=4))
                self.ids[0] += 1
                bad = toy_call(
                    f"x{self.ids[0]}/0",
                    junk,
                    junk,
                    seq=-1,
                    agent=self.agent,
                    status=self.draw(st.sampled_from([CallStatus.INCOMPLETE, CallStatus.UNUSABLE])),
                )
                self.units.append([bad])
            current = self.step(current)


def _flat(messages: list[list[int]]) -> list[int]:
    return [t for m in messages for t in m]


@st.composite
def episodes(draw: st.DrawFn) -> Episode:
    agents = draw(
        st.lists(st.sampled_from([None, "planner", "coder"]), min_size=1, max_size=3, unique=True)
    )
    ids = [0, 0]
    sims = []
    for agent in agents:
        sim = AgentSim(draw, agent, ids)
        sim.run(draw(st.integers(0, 19)))
        sims.append(sim)
    # Interleave the agents' requests, keeping each agent's order; choices share their seq.
    tags = [i for i, sim in enumerate(sims) for _ in sim.units]
    order = draw(st.permutations(tags))
    cursors = [0] * len(sims)
    episode = Episode()
    for seq, i in enumerate(order):
        for call in sims[i].units[cursors[i]]:
            call.seq = seq
            episode.calls.append(call)
        cursors[i] += 1
    for sim in sims:
        episode.expected.update(sim.expected)
    complete = [c for c in episode.calls if c.status is CallStatus.COMPLETE]
    redeliver: bool = draw(st.booleans())
    if complete and redeliver:  # a re-delivered call: same id, used once
        again: Call = draw(st.sampled_from(complete))
        episode.calls.append(dataclasses.replace(again))
    return episode


def check_invariants(
    calls: list[Call], samples: list[Sample], divergences: list[Divergence]
) -> None:
    complete: dict[str, Call] = {}
    for call in calls:
        if call.status is CallStatus.COMPLETE:
            complete.setdefault(call.call_id, call)
    trained: Counter[str] = Counter()
    for sample in samples:
        sample.validate()
        n = sample.num_tokens
        covered = np.zeros(n, dtype=bool)
        end = 0
        for span in sample.spans:
            call = complete[span.call_id]
            trained[span.call_id] += 1
            assert call.agent == sample.agent
            assert span.context_start == end  # spans tile the sample
            assert span.start == call.prompt_ids.shape[0]
            assert span.end - span.start == call.num_sampled
            # Context equals the call's prompt; trained ids are exactly the engine's ids.
            assert np.array_equal(sample.token_ids[: span.start], call.prompt_ids)
            assert np.array_equal(sample.token_ids[span.start : span.end], call.sampled_ids)
            assert sample.loss_mask[span.start : span.end].all()
            assert not sample.loss_mask[span.context_start : span.start].any()
            covered[span.start : span.end] = True
            if sample.logprobs is not None:
                assert call.logprobs is not None
                assert np.array_equal(sample.logprobs[span.start : span.end], call.logprobs)
            assert (span.reward, span.policy_version) == (call.reward, call.policy_version)
            end = span.end
        assert end == n
        # Every loss-1 position is some call's sampled id; logprobs are 0.0 everywhere else.
        assert np.array_equal(sample.loss_mask.astype(bool), covered)
        if sample.logprobs is not None:
            assert not sample.logprobs[~covered].any()
        else:
            assert any(complete[c].logprobs is None for c in sample.call_ids)
    # Each complete call is trained in exactly one sample.
    assert trained == Counter(dict.fromkeys(complete, 1))
    assert sum(s.num_trained for s in samples) == sum(c.num_sampled for c in complete.values())

    # One divergence per sample but each agent's first; reasons and positions are consistent.
    by_id = {s.sample_id: s for s in samples}
    assert len(by_id) == len(samples)
    firsts = {s.agent for s in samples if s.start_reason == "episode_start"}
    assert len(firsts) == sum(s.start_reason == "episode_start" for s in samples)
    assert len(divergences) == len(samples) - len(firsts)
    for d in divergences:
        child, parent = by_id[d.sample_id], by_id[d.prev_sample_id]
        assert child.call_ids[0] == d.call_id and child.start_reason == d.kind.value
        assert d.prev_call_id in parent.call_ids and child.agent == parent.agent == d.agent
        new, prev = complete[d.call_id], complete[d.prev_call_id]
        if d.kind is K.RESAMPLE:
            assert np.array_equal(new.prompt_ids, prev.prompt_ids)
            assert d.rewrite_point == new.prompt_ids.shape[0]
        else:
            tip = prev.token_ids
            assert common_prefix_len(new.prompt_ids, tip) == d.rewrite_point < tip.shape[0]
    ended = {d.prev_sample_id for d in divergences}
    for s in samples:
        assert s.end_reason == "end" or s.sample_id in ended


def check_kinds(
    episode: Episode,
    divergences: list[Divergence],
    mapping: dict[DivergenceKind, DivergenceKind],
    mode: str,
) -> None:
    """Each injected divergence is found with its kind, unless the assembler compared the prompt
    with a sibling of the re-rendered call that shares the rewrite point exactly (a genuine tie)."""
    got = {d.call_id: d for d in divergences}
    assert set(got) == set(episode.expected)
    for call_id, (kind, after) in episode.expected.items():
        d = got[call_id]
        if d.kind is mapping.get(kind, kind):
            continue
        assert after is not None and d.prev_call_id != after.call_id, (mode, call_id, d.kind, kind)
        new = next(c for c in episode.calls if c.call_id == call_id)
        assert common_prefix_len(new.prompt_ids, after.token_ids) == d.rewrite_point


def run_modes(episode: Episode) -> None:
    results = []
    for mode, options, mapping in (
        ("text", {"decode": decode, "special_ids": SPECIAL_IDS, "eos_ids": EOS_IDS}, {}),
        ("ids", {"special_ids": SPECIAL_IDS, "eos_ids": EOS_IDS}, IDS_ONLY),
        ("bare", {}, BARE),
    ):
        samples, divergences = assemble_merged(
            episode.calls, EpisodeContext("ep", 1.0), AssemblyOptions.of(**options)
        )
        check_invariants(episode.calls, samples, divergences)
        check_kinds(episode, divergences, mapping, mode)
        results.append(samples)
    # Decode and special ids only name the kinds: the samples are identical in every mode.
    for other in results[1:]:
        assert [s.sample_id for s in other] == [s.sample_id for s in results[0]]
        for a, b in zip(results[0], other, strict=True):
            assert np.array_equal(a.token_ids, b.token_ids)
            assert np.array_equal(a.loss_mask, b.loss_mask)
            assert (a.start_reason, a.end_reason) != ("", "") and a.reward == b.reward


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_random_episodes_keep_every_invariant(episode: Episode) -> None:
    """Every sampled token is trained once at its span, context is prompts, kinds are right."""
    run_modes(episode)


@settings(max_examples=20, deadline=None)
@given(episodes(), st.randoms(use_true_random=False))
def test_call_order_in_the_input_does_not_matter(episode: Episode, rnd: random.Random) -> None:
    """Calls are ordered by (seq, choice_index): shuffling the input list changes nothing."""
    shuffled = list(episode.calls)
    rnd.shuffle(shuffled)
    context, options = EpisodeContext("e"), AssemblyOptions.of(decode=decode)
    a, da = assemble_merged(episode.calls, context, options)
    b, db = assemble_merged(shuffled, context, options)
    assert [s.sample_id for s in a] == [s.sample_id for s in b]
    assert [d.to_dict() for d in da] == [d.to_dict() for d in db]
