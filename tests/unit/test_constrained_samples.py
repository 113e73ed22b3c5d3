"""How each span was sampled survives every output format: JSON Lines, rotating Parquet / Arrow /
JSONL parts, the binary frame and named fields (Redis Streams, Ray), and the assemblers set it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.call_factory import make_call
from tito_agents.assembly import AssemblyMode, AssemblyOptions, EpisodeContext
from tito_agents.assembly.merged import assemble_merged
from tito_agents.assembly.per_call import sample_of_call
from tito_agents.calls import Call
from tito_agents.samples import CallSpan, Sample
from tito_agents.sinks import JsonlSink, RotatingFileSink, read_samples
from tito_agents.sinks.codec import decode_fields, decode_frame, encode_fields, encode_frame
from tito_agents.sinks.harness import synthetic_sample


def flagged(index: int, *, policy: bool = True) -> Sample:
    """A sample whose second half was sampled under a forced tool choice and re-scored."""
    sample = synthetic_sample(index, 64)
    span = sample.spans[0]
    half = (span.start + span.end) // 2
    sample.spans = [
        CallSpan("c/0", 0, span.start, half, "stop", logprob_source="policy"),
        CallSpan(
            "c2/0",
            half,
            half,
            span.end,
            "tool_calls",
            constrained="tool_choice=required",
            logprob_source="rescored" if policy else "masked",
            rescore_error=None if policy else "the server answered HTTP 404: no /completions",
        ),
    ]
    if policy:
        assert sample.logprobs is not None
        sample.policy_logprobs = sample.logprobs.copy()
        sample.policy_logprobs[half : span.end] -= 3.0
    return sample


def same(a: Sample, b: Sample) -> None:
    """`b` holds what `a` holds: every field of `to_dict`, by value (arrays element by element)."""
    left, right = a.to_dict(), b.to_dict()
    assert left.keys() == right.keys()
    for key, value in left.items():
        if isinstance(value, np.ndarray) or isinstance(right[key], np.ndarray):
            assert (value is None) == (right[key] is None), key
            np.testing.assert_array_equal(value, right[key], err_msg=key)
        else:
            assert value == right[key], key
    assert [s.to_dict() for s in a.spans] == [s.to_dict() for s in b.spans]
    for name in ("token_ids", "loss_mask", "logprobs", "policy_logprobs"):
        left, right = getattr(a, name), getattr(b, name)
        assert (left is None) == (right is None), name
        if left is not None:
            np.testing.assert_array_equal(left, right)


SAMPLES = [flagged(0), flagged(1, policy=False), synthetic_sample(2)]


@pytest.mark.parametrize(
    "change",
    [
        {"reward": 0.25},
        {"episode_id": "another-episode"},
        {"agent": "another-agent"},
        {"metadata": {"turn": 9}},
    ],
)
def test_same_sees_a_changed_value(change: dict[str, object]) -> None:
    """The round-trip check compares values, not only which fields exist: a round trip that
    changed the reward, the episode or the agent fails it."""
    sample = flagged(0)
    changed = decode_frame(encode_frame(sample))
    for name, value in change.items():
        setattr(changed, name, value)
    with pytest.raises(AssertionError):
        same(sample, changed)


def test_constrained_mask_and_ratio_logprobs() -> None:
    sample = SAMPLES[0]
    mask = sample.constrained_mask()
    span = sample.spans[1]
    assert mask[span.start : span.end].all() and mask.sum() == span.end - span.start
    assert sample.ratio_logprobs() is sample.policy_logprobs
    assert SAMPLES[1].ratio_logprobs() is SAMPLES[1].logprobs


def test_frame_and_fields_round_trip() -> None:
    for sample in SAMPLES:
        same(sample, decode_frame(encode_frame(sample)))
        fields = {k: bytes(v) for k, v in encode_fields(sample).items()}
        same(sample, decode_fields(fields))


def test_fields_missing_policy_logprobs_are_refused() -> None:
    from tito_agents.errors import SampleFormatError
    from tito_agents.sinks.codec import FIELD_POLICY_LOGPROBS

    fields = {k: bytes(v) for k, v in encode_fields(SAMPLES[0]).items()}
    del fields[FIELD_POLICY_LOGPROBS]
    with pytest.raises(SampleFormatError):
        decode_fields(fields)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with JsonlSink(path) as sink:
        sink.write(SAMPLES)
    for want, got in zip(SAMPLES, read_samples(path), strict=True):
        same(want, got)


@pytest.mark.parametrize("suffix", ["parquet", "arrow", "jsonl"])
def test_rotating_parts_round_trip(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("pyarrow", reason="columnar parts need pyarrow (the arrow extra)")
    sink = RotatingFileSink(tmp_path / f"out/samples.{suffix}")
    sink.write(SAMPLES)
    sink.close()
    got = sorted(read_samples(tmp_path / "out"), key=lambda s: s.sample_id)
    for want, back in zip(sorted(SAMPLES, key=lambda s: s.sample_id), got, strict=True):
        same(want, back)


def _call(seq: int, prompt: list[int], sampled: list[int], constrained: str | None) -> Call:
    return make_call(
        f"r{seq}/0", prompt, sampled, logprob=-0.1, seq=seq, agent="a", constrained=constrained
    )


def test_merged_sample_keeps_each_spans_kind() -> None:
    first = _call(0, [1, 2, 3], [4, 5], "tool_choice=required")
    second = _call(1, [1, 2, 3, 4, 5, 6], [7, 8, 9], None)
    first.policy_logprobs = np.array([-2.0, -3.0], dtype=np.float32)
    (sample,), _ = assemble_merged(
        [first, second], EpisodeContext("e", None), AssemblyOptions(AssemblyMode.MERGED)
    )
    kinds = [(s.constrained, s.logprob_source) for s in sample.spans]
    assert kinds == [("tool_choice=required", "rescored"), (None, "policy")]
    assert sample.policy_logprobs is not None and sample.logprobs is not None
    assert sample.policy_logprobs[3:5].tolist() == [-2.0, -3.0]
    np.testing.assert_array_equal(sample.policy_logprobs[6:], sample.logprobs[6:])
    assert sample.constrained_mask().tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]


def test_unrecovered_call_is_masked_and_has_no_policy_logprobs() -> None:
    call = _call(0, [1, 2], [3, 4], "response_format=json_schema")
    call.rescore_error = "the server answered HTTP 404"
    sample = sample_of_call(call, EpisodeContext("e", None))
    (span,) = sample.spans
    assert (span.logprob_source, span.rescore_error) == ("masked", "the server answered HTTP 404")
    assert sample.policy_logprobs is None
    free = sample_of_call(_call(1, [1], [2], None), EpisodeContext("e", None))
    assert free.spans[0].logprob_source == "policy" and free.spans[0].rescore_error is None


def test_converters_use_policy_logprobs_and_carry_the_constrained_mask() -> None:
    from tito_agents.convert import pack_batch, pad_batch, to_trl_rollout, to_verl_batch

    rescored, masked, free = SAMPLES
    assert rescored.policy_logprobs is not None and masked.logprobs is not None
    padded = pad_batch(SAMPLES)
    assert padded.logprobs is not None and padded.constrained_mask is not None
    np.testing.assert_array_equal(padded.logprobs[0, :64], rescored.policy_logprobs)
    np.testing.assert_array_equal(padded.logprobs[1, :64], masked.logprobs)
    np.testing.assert_array_equal(padded.constrained_mask[0, :64], rescored.constrained_mask())
    assert not padded.constrained_mask[2].any()
    assert "constrained_mask" in padded.arrays()

    packed = pack_batch(SAMPLES)
    assert packed.logprobs is not None and packed.constrained_mask is not None
    np.testing.assert_array_equal(packed.logprobs[:64], rescored.policy_logprobs)
    assert int(packed.constrained_mask.sum()) == sum(
        int(s.constrained_mask().sum()) for s in SAMPLES
    )

    rows = to_trl_rollout(SAMPLES)
    span = masked.spans[1]
    split = len(masked.token_ids) - len(rows["completion_ids"][1])
    masked_row = rows["logprobs"][1]
    assert all(v is None for v in masked_row[span.start - split : span.end - split])
    assert all(v is not None for v in rows["logprobs"][0])  # re-scored: usable everywhere

    verl = to_verl_batch(SAMPLES)
    assert "constrained_mask" in verl.tensors()
    assert (
        "constrained_mask" not in pad_batch([free]).arrays()
    )  # unchanged when nothing is constrained
