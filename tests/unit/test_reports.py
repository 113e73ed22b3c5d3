"""The one counting over samples (`SamplesSummary`) behind both reports: `tito-agents stats` and
`assembly_report`, which therefore agree, also on files that hold each call twice."""

from __future__ import annotations

from tests.support.call_factory import make_call
from tito_agents.assembly import AssemblyMode, AssemblyOptions, EpisodeContext, assemble
from tito_agents.assembly.report import assembly_report, summarize
from tito_agents.samples import Sample


def _both() -> list[Sample]:
    first = make_call("a", [1, 2, 3], [10, 11], request_id="a", agent="solver")
    second = make_call("b", [1, 2, 3, 10, 11, 20, 21], [12, 13, 14], request_id="b", agent="solver")
    samples, _ = assemble(
        [first, second], EpisodeContext("ep"), AssemblyOptions(mode=AssemblyMode.BOTH)
    )
    return samples


def test_assembly_report_counts_each_call_once_as_the_summary_does() -> None:
    """With assembly="both" every call is in a per-call and a merged sample: the report counts
    calls and tokens once (the merged view), as `SamplesSummary` does; samples as written."""
    samples = _both()
    merged = [s for s in samples if s.view == "merged"]
    report = assembly_report(samples)
    summary = summarize(samples).to_dict()
    assert (report.calls, summary["calls"]) == (2, 2)
    assert report.tokens == summary["tokens"] == sum(s.num_tokens for s in merged)
    assert report.trained_tokens == summary["trained_tokens"] == 5
    assert report.samples == summary["samples"] == len(samples) == 3
    assert summary["views"]["per_call"]["calls"] == 2
