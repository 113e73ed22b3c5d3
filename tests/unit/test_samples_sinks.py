"""Per-call samples and the JSON Lines sink and reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tito_agents as tito
from tests.support import call_factory
from tito_agents.assembly import EpisodeContext, assemble_per_call
from tito_agents.calls import Call, CallStatus
from tito_agents.sinks.jsonl import encode_sample


def numbered_call(i: int, prompt: list[int], sampled: list[int], *, lp: bool = True) -> Call:
    return call_factory.make_call(
        f"resp{i}/0", prompt, sampled, logprob=-0.5 if lp else None, seq=i, ended_at=1.0
    )


def test_per_call_sample_layout() -> None:
    """token_ids = prompt + sampled; loss 1 exactly on sampled ids; logprobs 0.0 elsewhere."""
    call = numbered_call(0, [1, 2, 3], [7, 8, 2])
    (sample,) = assemble_per_call([call], EpisodeContext("e", 1.0))
    assert sample.token_ids.tolist() == [1, 2, 3, 7, 8, 2]
    assert sample.loss_mask.tolist() == [0, 0, 0, 1, 1, 1]
    assert sample.logprobs is not None
    assert sample.logprobs.tolist() == [0.0, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert sample.reward == 1.0
    assert sample.spans[0].start == 3 and sample.spans[0].end == 6
    assert sample.call_ids == ["resp0/0"]


def test_call_reward_overrides_episode_reward() -> None:
    """A per-call reward is the sample's reward; otherwise the episode reward is."""
    a, b = numbered_call(0, [1], [2]), numbered_call(1, [1], [3])
    a.reward = 0.25
    samples = assemble_per_call([b, a], EpisodeContext("e", 1.0))
    assert [s.reward for s in samples] == [0.25, 1.0]  # request order, not argument order


def test_only_complete_calls_become_samples() -> None:
    """Incomplete and unusable calls are never samples."""
    calls = [numbered_call(i, [1], [2]) for i in range(3)]
    calls[1].status = CallStatus.INCOMPLETE
    calls[2].status = CallStatus.UNUSABLE
    assert len(assemble_per_call(calls, EpisodeContext("e", None))) == 1


def test_sample_ids_are_deterministic_and_unique() -> None:
    """The same call in the same episode gives the same id; other calls or episodes differ."""
    call = numbered_call(0, [1], [2])
    (s1,) = assemble_per_call([call], EpisodeContext("e", None))
    (s2,) = assemble_per_call([call], EpisodeContext("e", None))
    (s3,) = assemble_per_call([call], EpisodeContext("f", None))
    assert s1.sample_id == s2.sample_id != s3.sample_id


def test_jsonl_roundtrip(tmp_path: Path) -> None:
    """What the sink writes, read_samples returns field for field."""
    path = tmp_path / "sub" / "s.jsonl"
    calls = [numbered_call(i, [1, 2], [3, 4], lp=i % 2 == 0) for i in range(4)]
    samples = assemble_per_call(calls, EpisodeContext("e", 0.5, task_id="t", group_id="g"))
    with tito.sinks.JsonlSink(path) as sink:
        sink.write(samples[:2])
        sink.write(samples[2:])
    back = list(tito.read_samples(path))
    assert len(back) == 4
    for a, b in zip(samples, back, strict=True):
        assert a.sample_id == b.sample_id
        assert b.token_ids.dtype == np.int32
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.loss_mask.tolist() == b.loss_mask.tolist()
        assert (a.logprobs is None) == (b.logprobs is None)
        if a.logprobs is not None and b.logprobs is not None:
            assert a.logprobs.tolist() == b.logprobs.tolist()
        assert (b.task_id, b.group_id, b.reward) == ("t", "g", 0.5)
        assert b.spans[0].start == a.spans[0].start


def test_reader_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    """A crash mid-write tears at most the last line; every complete sample is still read."""
    path = tmp_path / "s.jsonl"
    samples = assemble_per_call(
        [numbered_call(i, [1], [2]) for i in range(3)], EpisodeContext("e", None)
    )
    data = b"".join(encode_sample(s) for s in samples)
    path.write_bytes(data[:-10])
    assert [s.sample_id for s in tito.read_samples(path)] == [s.sample_id for s in samples[:2]]


def test_reader_refuses_corruption_in_the_middle(tmp_path: Path) -> None:
    """A broken line that is not the last one is an error naming file and line."""
    path = tmp_path / "s.jsonl"
    (sample,) = assemble_per_call([numbered_call(0, [1], [2])], EpisodeContext("e", None))
    path.write_bytes(encode_sample(sample) + b"{not json\n" + encode_sample(sample))
    with pytest.raises(tito.errors.SampleFormatError, match=r"s\.jsonl:2"):
        list(tito.read_samples(path))


def test_reader_refuses_inconsistent_samples(tmp_path: Path) -> None:
    """A line whose arrays disagree in length is not a sample."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(
        b'{"sample_id":"a","episode_id":"e","token_ids":[1,2],"loss_mask":[0],'
        b'"logprobs":null,"call_ids":[],"spans":[]}\n'
    )
    with pytest.raises(tito.errors.SampleFormatError, match="loss_mask"):
        list(tito.read_samples(path))


def test_callback_sink_receives_batches() -> None:
    """CallbackSink hands each batch to the user's function."""
    got: list[int] = []
    sink = tito.sinks.CallbackSink(lambda batch: got.append(len(batch)))
    samples = assemble_per_call([numbered_call(0, [1], [2])], EpisodeContext("e", None))
    sink.write(samples)
    assert got == [1]


async def test_sinks_have_async_twins(tmp_path: Path) -> None:
    """awrite/aflush/aclose work on the default sink."""
    path = tmp_path / "s.jsonl"
    sink = tito.sinks.JsonlSink(path)
    samples = assemble_per_call([numbered_call(0, [1], [2])], EpisodeContext("e", None))
    await sink.awrite(samples)
    await sink.aflush()
    await sink.aclose()
    await sink.aclose()  # idempotent
    assert len(list(tito.read_samples(path))) == 1
