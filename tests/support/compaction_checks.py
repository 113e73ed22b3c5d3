"""What every compaction pattern's samples must show, on the fake and the real vLLM: one linked
trajectory (one id, segments numbered and chained), the summary calls trained as segments of it,
each followed by a segment started by the summary, the episode's reward on every segment, and one
GRPO advantage for the whole trajectory; and every call the agent made trained exactly once."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tito_agents.convert import group_advantages
from tito_agents.samples import Sample


def assert_one_linked_trajectory(samples: Sequence[Sample], summaries: int) -> None:
    assert {s.trajectory_id for s in samples} == {samples[0].trajectory_id}
    assert [s.segment_index for s in samples] == list(range(len(samples)))
    assert [s.prev_sample_id for s in samples[1:]] == [s.sample_id for s in samples[:-1]]
    assert sum(s.is_summary for s in samples) == summaries
    for before, after in itertools.pairwise(samples):
        if before.is_summary:
            assert after.rewrite == "summary" and not after.is_summary
    assert all(s.reward == 1.0 for s in samples)
    assert len(set(group_advantages(list(samples), unit="trajectory").tolist())) == 1


def assert_each_call_trained_once(samples: Sequence[Sample], sent: Sequence[str]) -> None:
    """Every call the agent made (its response ids) is in exactly one span: none lost, none twice."""
    spans = [span for s in samples for span in s.spans]
    assert sorted(sp.call_id.rsplit("/", 1)[0] for sp in spans) == sorted(sent)
    assert len(spans) == len({sp.call_id for sp in spans})
    assert sum(s.num_trained for s in samples) == sum(sp.end - sp.start for sp in spans)
