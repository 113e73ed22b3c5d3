"""Property tests of linked segments over random rewrite sequences.

Each generated agent runs a toy ChatML conversation; between turns its history may be extended,
summarised (by a call labelled `role="summarizer"`, or an unlabelled one whose summary the next
prompt quotes), truncated (oldest messages dropped), edited (an earlier message changed) or
stripped of its reasoning blocks. Two agents interleave. Checked: every sampled token is trained in
exactly one merged sample, each agent's samples form one linked trajectory, the summary calls are
segments trained with the episode's reward, and each rewrite is named.
"""

from __future__ import annotations

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
    marker,
    message,
    toy_call,
)
from tito_agents.assembly import AssemblyOptions, EpisodeContext, assemble_merged
from tito_agents.calls import Call
from tito_agents.convert import group_advantages
from tito_agents.samples import SUMMARIZER_ROLE, Sample, trajectory_id_for

WORD = st.integers(LETTER0, PAIR0 + 26 * 26 - 1)
OPS = [
    "extend",
    "extend",
    "summary",
    "summary_unlabelled",
    "truncate",
    "edit",
    "clear_reasoning",
    "switch_policy",
]
EXPECTED = {
    "summary": "summary",
    "summary_unlabelled": "summary",
    "truncate": "prefix_truncated",
    "edit": "message_edited",
    "clear_reasoning": "reasoning_cleared",
}


@dataclass
class Step:
    """One request of one agent, before the episode's calls are interleaved."""

    prompt: list[int]
    sampled: list[int]
    summarizer: bool = False
    labelled: bool = False
    expected: str | None = None
    """The rewrite kind the segment this call starts must carry (None: it extends, or unknown)."""
    policy: str | None = None
    switched: bool = False
    """The agent's policy changed (`Collector(policies=...)` mid-episode) just before this call."""


@dataclass
class AgentRun:
    draw: st.DrawFn
    counter: list[int]
    steps: list[Step] = field(default_factory=list)
    history: list[list[int]] = field(default_factory=list)
    policy: str | None = None

    def fresh(self) -> int:
        self.counter[0] += 1
        assert self.counter[0] < NUM_MARKERS
        return marker(self.counter[0])

    def msg(self, role: int) -> list[int]:
        return message(role, self.fresh(), *self.draw(st.lists(WORD, max_size=3)))

    def turn(self, expected: str | None, switched: bool = False) -> None:
        """The agent samples one assistant message on its history."""
        think: list[int] = []
        if self.draw(st.booleans()):
            think = [THINK, *self.draw(st.lists(WORD, max_size=2)), END_THINK]
        sampled = [*think, self.fresh(), *self.draw(st.lists(WORD, min_size=1, max_size=4)), IM_END]
        prompt = [t for m in self.history for t in m] + HEADER
        self.steps.append(
            Step(prompt, sampled, expected=expected, policy=self.policy, switched=switched)
        )
        self.history.append([*HEADER, *sampled, NL])

    def summarise(self, labelled: bool) -> None:
        """A summariser call (its own request), then the history is the summary."""
        quoted = [t for m in self.history[1:] for t in m if t >= LETTER0][:12]
        prompt = [*message(SYSTEM, self.fresh()), *message(USER, *quoted), *HEADER]
        body = [self.fresh(), *self.draw(st.lists(WORD, min_size=8, max_size=10))]
        self.steps.append(
            Step(prompt, [*body, IM_END], summarizer=True, labelled=labelled, policy=self.policy)
        )
        self.history = [self.history[0], message(USER, *body)]

    def run(self, n_ops: int) -> None:
        self.history = [self.msg(SYSTEM), self.msg(USER)]
        self.turn(None)
        for _ in range(n_ops):
            op = self.draw(st.sampled_from(OPS))
            if op in ("summary", "summary_unlabelled"):
                self.summarise(labelled=op == "summary")
            elif op == "truncate" and len(self.history) > 4:
                drop = self.draw(st.integers(1, len(self.history) - 3))
                self.history = [self.history[0], *self.history[1 + drop :]]
            elif op == "edit" and len(self.history) > 3:
                at = self.draw(st.integers(1, len(self.history) - 2))
                old = self.history[at]
                self.history[at] = [*old[:3], self.fresh(), *old[4:]]
            elif op == "clear_reasoning" and any(THINK in m for m in self.history):
                self.history = [_without_think(m) for m in self.history]
            elif op == "switch_policy":
                self.policy = "b" if self.policy == "a" else "a"
            else:
                op = "extend"
            self.history.append(self.msg(self.draw(st.sampled_from([TOOL, USER]))))
            self.turn(EXPECTED.get(op), switched=op == "switch_policy")


def _without_think(msg: list[int]) -> list[int]:
    if THINK not in msg:
        return msg
    return [*msg[: msg.index(THINK)], *msg[msg.index(END_THINK) + 1 :]]


@st.composite
def episodes(draw: st.DrawFn) -> tuple[list[Call], dict[str, Step]]:
    counter = [0]
    runs = {name: AgentRun(draw, counter) for name in ("solver", "critic")}
    for run in runs.values():
        run.run(draw(st.integers(1, 6)))
    queues = {name: list(run.steps) for name, run in runs.items()}
    calls: list[Call] = []
    steps: dict[str, Step] = {}
    while any(queues.values()):
        name = draw(st.sampled_from(sorted(n for n, q in queues.items() if q)))
        step = queues[name].pop(0)
        seq = len(calls)
        call = toy_call(
            f"c{seq}",
            step.prompt,
            step.sampled,
            seq=seq,
            agent=name,
            labels={"role": SUMMARIZER_ROLE} if step.labelled else None,
            policy=step.policy,
        )
        calls.append(call)
        steps[call.call_id] = step
    return calls, steps


OPTIONS = AssemblyOptions.of("merged", decode=decode, special_ids=SPECIAL_IDS, eos_ids=EOS_IDS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(episodes())
def test_every_token_once_segments_linked_summaries_trained(
    episode: tuple[list[Call], dict[str, Step]],
) -> None:
    calls, steps = episode
    samples, divergences = assemble_merged(calls, EpisodeContext("ep", episode_reward=1.0), OPTIONS)

    # every sampled token trained exactly once, at its own place
    where: dict[str, Sample] = {}
    for sample in samples:
        for span in sample.spans:
            assert span.call_id not in where
            where[span.call_id] = sample
            assert sample.loss_mask[span.start : span.end].all()
            call = next(c for c in calls if c.call_id == span.call_id)
            assert np.array_equal(sample.token_ids[span.start : span.end], call.sampled_ids)
    assert set(where) == {c.call_id for c in calls}
    assert sum(s.num_trained for s in samples) == sum(int(c.sampled_ids.size) for c in calls)

    # one linked trajectory per agent, in order of first call
    for agent in ("solver", "critic"):
        segments = [s for s in samples if s.agent == agent]
        assert [s.segment_index for s in segments] == list(range(len(segments)))
        assert {s.trajectory_id for s in segments} == {trajectory_id_for("ep", agent)}
        assert [s.prev_sample_id for s in segments] == [
            None,
            *[s.sample_id for s in segments[:-1]],
        ]
        assert all(s.reward == 1.0 for s in segments)  # the episode's reward, summaries too
    advantages = group_advantages(samples, unit="trajectory")
    for agent in ("solver", "critic"):  # a policy switch puts the trajectory in each policy's group
        for policy in {s.policy for s in samples if s.agent == agent}:
            values = {
                float(a)
                for a, s in zip(advantages, samples, strict=True)
                if (s.agent, s.policy) == (agent, policy)
            }
            assert len(values) == 1

    # summaries are segments of their agent, say so, and the next segment says it follows one
    for call_id, step in steps.items():
        sample = where[call_id]
        span = next(sp for sp in sample.spans if sp.call_id == call_id)
        if step.summarizer:
            assert span.role == SUMMARIZER_ROLE
            assert sample.spans[0].call_id == call_id and sample.rewrite is None
        else:
            assert span.role is None
        if step.expected is not None and sample.spans[0].call_id == call_id:
            assert sample.rewrite == step.expected, (step.expected, sample.start_reason)
        if step.expected is not None:
            assert sample.spans[0].call_id == call_id  # every rewrite starts a segment
        if step.switched:  # one policy per sample: the switch starts a segment, not a rewrite
            assert sample.spans[0].call_id == call_id and sample.rewrite is None
            assert sample.start_reason in ("policy_switch", "resample", "branch")
        assert sample.policy == step.policy  # every call of a sample went to the sample's policy
    by_child = {d.sample_id: d for d in divergences}
    for sample in samples:
        if sample.segment_index:
            assert by_child[sample.sample_id].rewrite == sample.rewrite
