"""Linked-segment fields survive every sample format: JSON (lines), binary frame and fields, and
Arrow columns; files written before the fields existed read them as None."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pytest

from tests.support.toy_chatml import HEADER, IM_END, SYSTEM, USER, decode, marker, message, toy_call
from tito_agents.assembly import (
    AssemblyOptions,
    Divergence,
    EpisodeContext,
    assemble,
    assemble_merged,
)
from tito_agents.calls import Call
from tito_agents.convert import (
    ConversionError,
    group_advantages,
    to_agent_loop_outputs,
    to_verl_batch,
)
from tito_agents.errors import SampleFormatError
from tito_agents.samples import SUMMARIZER_ROLE, Sample
from tito_agents.sinks.arrow_schema import batch_to_samples, samples_to_batch
from tito_agents.sinks.codec import decode_fields, decode_frame, encode_fields, encode_frame
from tito_agents.sinks.jsonl import encode_sample
from tito_agents.sinks.reading import read_samples


def compacted_episode(*, labelled: bool = True) -> list[Call]:
    """An agent turn, a summariser call, then a turn on [system, summary]."""
    system = message(SYSTEM, marker(1))
    first_prompt = [*system, *message(USER, marker(2), 11, 12), *HEADER]
    first = [marker(3), 13, 14, IM_END]
    summary = [marker(4), *range(20, 30)]
    summariser_prompt = [*message(SYSTEM, marker(5)), *message(USER, 13, 14), *HEADER]
    after = [*system, *message(USER, *summary), *message(USER, marker(6)), *HEADER]
    return [
        toy_call("a", first_prompt, first, seq=0, agent="solver"),
        toy_call(
            "s",
            summariser_prompt,
            [*summary, IM_END],
            seq=1,
            agent="solver",
            labels={"role": SUMMARIZER_ROLE} if labelled else None,
        ),
        toy_call("b", after, [marker(7), 15, IM_END], seq=2, agent="solver"),
    ]


OPTIONS = AssemblyOptions.of("merged", decode=decode, eos_ids=[IM_END])


def assembled(labelled: bool = True) -> tuple[list[Sample], list[Divergence]]:
    return assemble_merged(compacted_episode(labelled=labelled), EpisodeContext("ep", 2.0), OPTIONS)


@pytest.mark.parametrize("labelled", [True, False])
def test_compaction_gives_three_linked_segments(labelled: bool) -> None:
    samples, divergences = assembled(labelled)
    assert [s.call_ids for s in samples] == [["a"], ["s"], ["b"]]
    assert [s.segment_index for s in samples] == [0, 1, 2]
    assert len({s.trajectory_id for s in samples}) == 1
    assert [s.prev_sample_id for s in samples] == [None, samples[0].sample_id, samples[1].sample_id]
    assert [s.rewrite for s in samples] == [None, None, "summary"]
    assert [s.is_summary for s in samples] == [False, True, False]
    assert all(s.reward == 2.0 for s in samples)
    assert [d.rewrite for d in divergences] == [None, "summary"]
    assert len(set(group_advantages(samples, unit="trajectory").tolist())) == 1


def roundtrips(sample: Sample) -> list[Sample]:
    json_back = Sample.from_dict(orjson.loads(encode_sample(sample)))
    fields = {k: bytes(v) for k, v in encode_fields(sample).items()}
    arrow_back = next(batch_to_samples(samples_to_batch([sample])))
    return [json_back, decode_frame(encode_frame(sample)), decode_fields(fields), arrow_back]


def test_every_format_keeps_the_trajectory_fields() -> None:
    samples, _ = assembled()
    for sample in samples:
        for back in roundtrips(sample):
            assert back.trajectory_id == sample.trajectory_id
            assert back.segment_index == sample.segment_index
            assert back.prev_sample_id == sample.prev_sample_id
            assert back.rewrite == sample.rewrite
            assert [sp.role for sp in back.spans] == [sp.role for sp in sample.spans]
            assert np.array_equal(back.token_ids, sample.token_ids)


def test_every_format_keeps_the_policy() -> None:
    """`Sample.policy` (one policy per agent) survives JSON Lines, the frame and field codecs
    and Arrow; a sample of no policy reads back as None."""
    samples, _ = assembled()
    routed = dataclasses.replace(samples[0], policy="planner-lora")
    for back in roundtrips(routed):
        assert back.policy == "planner-lora"
    for back in roundtrips(samples[1]):
        assert back.policy is None


def test_per_call_spans_carry_the_role_and_no_segments() -> None:
    samples, _ = assemble(compacted_episode(), EpisodeContext("ep", 2.0))
    assert [s.spans[0].role for s in samples] == [None, SUMMARIZER_ROLE, None]
    assert {s.trajectory_id for s in samples} == {None}


def test_jsonl_file_keeps_view_last_and_reads_back(tmp_path: Path) -> None:
    samples, _ = assembled()
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(encode_sample(s) for s in samples))
    assert all(line.endswith(b',"view":"merged"}') for line in path.read_bytes().splitlines())
    assert [s.rewrite for s in read_samples(path)] == [None, None, "summary"]


def test_older_files_read_the_fields_as_none() -> None:
    samples, _ = assembled()
    data = orjson.loads(encode_sample(samples[2]))
    for key in ("trajectory_id", "segment_index", "prev_sample_id", "rewrite"):
        del data[key]
    for span in data["spans"]:
        del span["role"]
    old = Sample.from_dict(data)
    assert (old.trajectory_id, old.segment_index, old.rewrite) == (None, None, None)
    batch = samples_to_batch(samples).drop_columns(["trajectory_id", "segment_index", "rewrite"])
    assert [s.segment_index for s in batch_to_samples(pa.Table.from_batches([batch]))] == [None] * 3


def test_a_bad_segment_index_is_refused() -> None:
    data = orjson.loads(encode_sample(assembled()[0][0]))
    data["segment_index"] = True
    with pytest.raises(SampleFormatError, match="integer"):
        Sample.from_dict(data)


def test_verl_layouts_carry_the_trajectory() -> None:
    samples, _ = assembled()
    non_tensors = to_verl_batch(samples).non_tensors()
    assert non_tensors["segment_index"].tolist() == [0, 1, 2]
    assert len(set(non_tensors["trajectory_id"].tolist())) == 1
    extras = [r["extra_fields"] for r in to_agent_loop_outputs(samples)]
    assert [e["is_summary"] for e in extras] == [False, True, False]
    assert extras[2]["prev_sample_id"] == samples[1].sample_id


def test_trajectory_unit_counts_each_agent_once_per_episode() -> None:
    """Two rollouts of one task; the first has a compacted solver (three segments) and a critic
    rewarded on its own call: three trajectories in the group, each segment gets its own's value."""
    critic = toy_call("k", [*message(USER, marker(40)), *HEADER], [marker(41), IM_END], seq=3)
    critic.agent, critic.reward = "critic", 0.5
    first, _ = assemble_merged(
        [*compacted_episode(), critic], EpisodeContext("e1", 2.0, group_id="g"), OPTIONS
    )
    second, _ = assemble_merged(
        compacted_episode()[:1], EpisodeContext("e2", 0.0, group_id="g"), OPTIONS
    )
    samples = [*first, *second]
    with pytest.raises(ConversionError, match="different rewards"):
        group_advantages(samples, unit="episode")
    adv = group_advantages(samples, unit="trajectory")
    rewards = np.array([2.0, 2.5, 0.0])  # e1 solver, e1 critic, e2 solver
    expected = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
    by_agent = {(s.episode_id, s.agent): float(a) for s, a in zip(samples, adv, strict=True)}
    assert by_agent[("e1", "solver")] == pytest.approx(expected[0], rel=1e-5)
    assert by_agent[("e1", "critic")] == pytest.approx(expected[1], rel=1e-5)
    assert by_agent[("e2", "solver")] == pytest.approx(expected[2], rel=1e-5)
    solver = [
        float(a)
        for s, a in zip(samples, adv, strict=True)
        if s.episode_id == "e1" and s.agent == "solver"
    ]
    assert len(solver) == 3 and len(set(solver)) == 1
