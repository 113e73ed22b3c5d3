"""How each span was sampled: resolved from the request and what is known of the server,
carried by every span through every sample format, the converters and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tests.support import call_factory
from tests.support.cli_samples import run_cli
from tito_agents.assembly import AssemblyOptions, EpisodeContext, assemble, sampling_report
from tito_agents.convert import (
    TokenSampling,
    pack_batch,
    pad_batch,
    pad_split_batch,
    to_verl_batch,
)
from tito_agents.samples import CallSpan, Sample
from tito_agents.sampling import (
    DECLARED,
    FROM_REQUEST,
    FROM_SERVER_DEFAULTS,
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    SamplingParams,
    ServerSampling,
    declare_sampling,
    mode_of_probe,
    resolve,
    span_sampling,
)
from tito_agents.sinks.arrow_schema import batch_to_samples, samples_to_batch
from tito_agents.sinks.codec import decode_fields, decode_frame, encode_fields, encode_frame
from tito_agents.sinks.reading import read_samples
from tito_agents.sinks.registry import open_sink
from tito_agents.testing.smollm2 import tokenizer_dir

FULL = SamplingParams(
    temperature=0.7,
    top_p=0.9,
    top_k=20,
    min_p=0.05,
    presence_penalty=0.5,
    frequency_penalty=0.25,
    repetition_penalty=1.1,
    seed=7,
    min_tokens=2,
    logit_bias=((5, -1.5), (11, 2.0)),
    allowed_token_ids=(1, 2, 3),
    bad_words=("foo", "bar baz"),
)


# ---- resolving a request ----


def test_request_values_win_and_left_out_fields_take_server_defaults() -> None:
    params, source = resolve({"temperature": 0.7}, {"temperature": 0.2, "top_p": 0.8, "top_k": 5})
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.8, 5, 0.0)
    assert source == FROM_SERVER_DEFAULTS
    params, source = resolve({"temperature": 0.7, "top_p": 0.95, "top_k": 3, "min_p": 0.0}, {})
    assert source == FROM_REQUEST and params.top_p == 0.95
    # no defaults known: vLLM's neutral values, and the source says "request"
    assert resolve({}, None) == (SamplingParams(), FROM_REQUEST)


def test_generate_route_sampling_params_take_no_server_defaults() -> None:
    params, source = resolve({"sampling_params": {"top_k": 4}}, {"temperature": 0.3})
    assert (params.temperature, params.top_k, source) == (1.0, 4, FROM_REQUEST)


def test_vllm_normalisation_and_extras() -> None:
    assert resolve({"temperature": 0.004})[0].temperature == 0.01
    greedy = resolve({"temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.2})[0]
    assert greedy.is_greedy and not greedy.is_truncated and greedy.top_k == 0
    assert resolve({"top_k": -1})[0].top_k == 0
    params = resolve(
        {"seed": 3, "logit_bias": {"11": 2, "5": -1.5}, "bad_words": "foo", "min_tokens": 1}
    )[0]
    assert params.logit_bias == ((5, -1.5), (11, 2.0)) and params.bad_words == ("foo",)
    assert params.seed == 3 and params.reshapes_logits and not params.is_plain
    with pytest.raises(ValueError):
        resolve({"temperature": "hot"})


def test_resolved_answers_are_reused_only_for_the_same_inputs() -> None:
    """`resolve` keeps its answers by what it reads: inputs equal in Python but read
    differently by vLLM (or written differently in a sample) never share one."""
    assert resolve({"temperature": 0.0, "min_p": -0.0})[0] == resolve({"temperature": 0.0})[0]
    assert str(resolve({"top_k": 2, "min_p": -0.0})[0].min_p) == "-0.0"
    assert str(resolve({"top_k": 2, "min_p": 0.0})[0].min_p) == "0.0"
    assert resolve({"seed": 1})[0].seed == 1
    with pytest.raises(ValueError):  # a boolean is no number, though True == 1
        resolve({"seed": True})
    with pytest.raises(ValueError):  # raised each time: failures are not kept
        resolve({"seed": True})
    defaults = {"temperature": 0.2}
    assert resolve({"top_k": 2}, defaults) == resolve({"top_k": 2}, dict(defaults))
    defaults["temperature"] = 0.4  # the server's defaults changed: read again
    assert resolve({"top_k": 2}, defaults)[0].temperature == 0.4
    assert resolve({"top_k": 2}, None)[1] == FROM_REQUEST
    request: dict[str, Any] = {"logit_bias": {"5": 1.0}}
    assert resolve(request)[0].logit_bias == ((5, 1.0),)
    request["logit_bias"]["5"] = 2.0  # an object value is read each time
    assert resolve(request)[0].logit_bias == ((5, 2.0),)


def test_span_sampling_with_declared_server_and_unreadable_requests() -> None:
    server = ServerSampling({"top_p": 0.9}, PROCESSED_LOGPROBS, declared=True)
    params, source, mode = span_sampling({"temperature": 0.5}, server)
    assert params is not None and params.top_p == 0.9
    assert (source, mode) == (DECLARED, PROCESSED_LOGPROBS)
    assert span_sampling({"top_p": "x"}, None) == (None, None, None)
    with pytest.raises(ValueError):
        ServerSampling(logprobs_mode="cooked")


def test_probe_answers_tell_the_logprobs_mode() -> None:
    def answer(*values: float) -> dict[str, Any]:
        tops = [{"logprob": v} for v in values]
        return {"choices": [{"logprobs": {"content": [{"top_logprobs": tops}]}}]}

    assert mode_of_probe(answer(0.0, -9999.0, -9999.0)) == PROCESSED_LOGPROBS
    assert mode_of_probe(answer(-0.6931, -0.6932, -9999.0)) == PROCESSED_LOGPROBS  # a tie kept
    assert mode_of_probe(answer(-2.14, -2.14, -2.64, -2.89, -3.52)) == RAW_LOGPROBS  # measured
    assert mode_of_probe(answer(3.5, 1.0)) is None  # logits, not logprobs
    assert mode_of_probe({"choices": []}) is None


# ---- assembly ----


def _calls(server: ServerSampling | None = None) -> list[Any]:
    return [
        call_factory.make_call(
            "r0/0",
            [1, 2],
            [3, 4],
            logprob=-0.5,
            seq=0,
            agent="a",
            sampling={"temperature": 0.7, "top_p": 0.9},
            server_sampling=server,
        ),
        call_factory.make_call(
            "r1/0", [1, 2, 3, 4, 5], [6], logprob=-0.5, seq=1, agent="a", server_sampling=server
        ),
    ]


def test_every_span_of_both_views_says_how_it_was_sampled() -> None:
    server = ServerSampling({"top_k": 40}, RAW_LOGPROBS)
    samples, _ = assemble(_calls(server), EpisodeContext("e"), AssemblyOptions.of("both"))
    assert {s.view for s in samples} == {"per_call", "merged"}
    for sample in samples:
        for span in sample.spans:
            assert span.sampling is not None and span.sampling.top_k == 40
            assert (span.sampling_source, span.logprobs_mode) == (
                FROM_SERVER_DEFAULTS,
                RAW_LOGPROBS,
            )
    first = samples[0].spans[0]
    assert first.sampling is not None and (first.sampling.temperature, first.truncated) == (
        0.7,
        True,
    )
    plain, _ = assemble(_calls()[1:], EpisodeContext("e"))
    span = plain[0].spans[0]
    assert (span.sampling, span.sampling_source, span.logprobs_mode) == (
        SamplingParams(),
        FROM_REQUEST,
        None,
    )


# ---- every format ----


def _sample(sampling: SamplingParams | None = FULL) -> Sample:
    spans = [
        CallSpan("c0", 0, 2, 4, "stop", sampling=sampling, sampling_source=DECLARED),
        CallSpan(
            "c1",
            4,
            5,
            6,
            "length",
            sampling=SamplingParams(),
            sampling_source=FROM_REQUEST,
            logprobs_mode=PROCESSED_LOGPROBS,
        ),
    ]
    return Sample(
        sample_id="s",
        episode_id="e",
        agent=None,
        token_ids=np.arange(6, dtype=np.int32),
        loss_mask=np.array([0, 0, 1, 1, 0, 1], dtype=np.uint8),
        logprobs=np.linspace(-1, 0, 6, dtype=np.float32),
        reward=1.0,
        call_ids=["c0", "c1"],
        spans=spans,
        view="merged",
    )


def _fields(sample: Sample) -> list[tuple[Any, ...]]:
    return [(s.sampling, s.sampling_source, s.logprobs_mode) for s in sample.spans]


@pytest.mark.parametrize("sampling", [FULL, SamplingParams(top_p=0.8), None])
def test_round_trip_through_json_frames_fields_and_arrow(sampling: SamplingParams | None) -> None:
    sample = _sample(sampling)
    again = [
        Sample.from_dict(
            orjson.loads(orjson.dumps(sample.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY))
        ),
        decode_frame(encode_frame(sample)),
        decode_fields({k: bytes(v) for k, v in encode_fields(sample).items()}),
        *batch_to_samples(samples_to_batch([sample])),
    ]
    for other in again:
        assert _fields(other) == _fields(sample)


@pytest.mark.parametrize("name", ["s.jsonl", "s.parquet", "s.arrow"])
def test_round_trip_through_every_file_sink(tmp_path: Path, name: str) -> None:
    sink = open_sink(str(tmp_path / name))
    sink.write([_sample()])
    sink.close()
    (back,) = list(read_samples(tmp_path / name if name.endswith("jsonl") else tmp_path))
    assert _fields(back) == _fields(_sample())


def test_files_without_the_fields_read_as_unknown() -> None:
    data = _sample().to_dict()
    for span in data["spans"]:
        for key in ("sampling", "sampling_source", "logprobs_mode"):
            del span[key]
    back = Sample.from_dict(data)
    assert _fields(back) == [(None, None, None)] * 2 and not back.spans[0].truncated


# ---- converters and the CLI ----


def test_converters_lay_out_per_token_sampling_only_when_needed() -> None:
    sample = _sample(SamplingParams(temperature=0.7, top_k=20))
    per_token = TokenSampling.of_sample(sample)
    assert per_token.temperature.tolist() == [1.0, 1.0, 0.7, 0.7, 1.0, 1.0]
    assert per_token.take(np.flatnonzero(sample.loss_mask)).top_k.tolist() == [20, 20, 0]
    packed = pack_batch([sample, _sample(SamplingParams())])
    assert packed.sampling is not None
    assert packed.arrays()["top_k"].tolist() == [0, 0, 20, 20, 0, 0] + [0] * 6
    shifted = packed.shifted().arrays()
    assert shifted["temperature"][:4].tolist() == pytest.approx([1.0, 0.7, 0.7, 1.0])
    padded = pad_batch([sample], padding_side="left", width=8)
    assert padded.sampling is not None
    assert padded.arrays()["temperature"][0].tolist() == pytest.approx(
        [1.0, 1.0, 1.0, 1.0, 0.7, 0.7, 1.0, 1.0]
    )
    plain = pack_batch([_sample(SamplingParams())])
    assert plain.sampling is None and "temperature" not in plain.arrays()
    verl = to_verl_batch([sample]).tensors()  # response half: positions 2..5
    assert verl["top_k"].tolist() == [[20, 20, 0, 0]]
    assert pad_split_batch([sample]).arrays()["response_temperature"].shape == (1, 4)
    assert "top_k" not in to_verl_batch([_sample(SamplingParams())]).tensors()


def test_cli_counts_marks_and_warns() -> None:
    truncated = _sample(SamplingParams(temperature=0.7, top_p=0.8))
    for span in truncated.spans:
        span.logprobs_mode = RAW_LOGPROBS
    counts = sampling_report.SamplingCounts()
    list(sampling_report.counting([truncated, truncated], counts))  # one episode: each call once
    data = counts.to_dict()
    assert (data["spans"], data["truncated"], data["raw_uncorrectable"]) == (2, 1, 1)
    assert "raw logprobs" in sampling_report.warnings(data)[0]
    assert sampling_report.marks(truncated.spans[0]).startswith("T=0.7 top_p=0.8 [raw_logprobs")
    assert sampling_report.marks(truncated.spans[1]) == ""
    declare_sampling(truncated.spans, logprobs_mode=PROCESSED_LOGPROBS)
    assert sampling_report.marks(truncated.spans[0]) == "T=0.7 top_p=0.8"
    counts = sampling_report.SamplingCounts()
    counts.add(_sample(FULL).spans)
    assert counts.reshaped == 1 and counts.mode_unknown == 1
    with pytest.raises(ValueError):
        declare_sampling(truncated.spans, logprobs_mode="cooked")


def test_stats_show_and_drift_report_truncated_spans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = _sample(SamplingParams(temperature=0.7, top_p=0.8))
    sample.token_ids = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
    declare_sampling(sample.spans, logprobs_mode=RAW_LOGPROBS)
    path = tmp_path / "s.jsonl"
    sink = open_sink(str(path))
    sink.write([sample])
    sink.close()
    code, out, _ = run_cli(["stats", path], capsys)
    assert code == 0 and "1 of 2 spans truncated (top-p, top-k or min-p" in out
    assert "1 of 2 spans tempered (sampled at a temperature other than 1)" in out
    assert "2 spans hold raw_logprobs (the model's own softmax" in out
    assert "hold raw logprobs" in out
    code, out, _ = run_cli(["stats", path, "--json"], capsys)
    assert orjson.loads(out)["sampling"]["raw_uncorrectable"] == 1
    code, out, _ = run_cli(["show", path, "--color", "never"], capsys)
    assert code == 0 and "T=0.7 top_p=0.8 [raw_logprobs: not correctable]" in out
    code, out, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir(), "--json"], capsys)
    assert orjson.loads(out)["sampling"]["truncated"] == 1
    code, out, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir()], capsys)
    assert "hold raw logprobs" in out
