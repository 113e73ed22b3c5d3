"""Sampled otherwise than T=1 on the real CPU vLLM, in the two logprobs modes.

Raw mode (the standard server, vLLM's default): the probe says so, every span records the sampling
its request asked for, and the trainer's full softmax matches the rollout logprobs while its
behaviour logprobs do not (the rollout logprobs are not those of the distribution that sampled:
`stats` warns). Processed mode (`--logprobs-mode processed_logprobs`, a server of its own): the
rollout logprobs are the behaviour distribution's, and the trainer's behaviour logprobs match them
to the baseline's noise while its full softmax is far off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.support.e2e_servers import load_vllm_server_script
from tito_agents.assembly import sampling_report
from tito_agents.sampling import (
    FROM_REQUEST,
    PROCESSED_LOGPROBS,
    RAW_LOGPROBS,
    declare_sampling,
    probe_logprobs_mode,
)

torch = pytest.importorskip("torch", reason="the trainer check needs torch")
pytest.importorskip("transformers", reason="the trainer check needs transformers")

from tito_agents.trainer_check import behaviour_figures, load_policy  # noqa: E402

pytestmark = pytest.mark.e2e

PARAMS = {"temperature": 0.7, "top_k": 20}
PROMPTS = ("Describe a quiet harbour at dawn.", "Tell me about the history of bread.")


def _collect(base_url: str, model: str, tmp_path: Path) -> list[tito.Sample]:
    collector = tito.Collector(tmp_path / "samples.jsonl", capture_logprobs=True)
    client = collector.wrap(openai.OpenAI(base_url=base_url, api_key="EMPTY", timeout=600))
    samples: list[tito.Sample] = []
    for i, prompt in enumerate(PROMPTS):
        with collector.episode(task_id=f"p{i}") as ep:
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=32,
                seed=i,
                extra_body=dict(PARAMS),
            )
        samples += ep.samples
    collector.close()
    return samples


def _probe(base_url: str, model: str) -> str:
    mode = probe_logprobs_mode(base_url, model, timeout=120)
    assert mode is not None, "the one-token probe could not tell the server's logprobs mode"
    return mode


@pytest.fixture(scope="module")
def policy() -> Any:
    return load_policy(Path(load_vllm_server_script().model_dir()), "fp32")


def test_raw_mode_spans_say_how_they_were_sampled(
    vllm_base_url: str, vllm_model: str, policy: Any, tmp_path: Path
) -> None:
    mode = _probe(vllm_base_url, vllm_model)
    if mode != RAW_LOGPROBS:
        pytest.skip(f"the standard server runs {mode}, not vLLM's default raw_logprobs")
    samples = _collect(vllm_base_url, vllm_model, tmp_path)
    for sample in samples:
        (span,) = sample.spans
        assert span.sampling is not None and span.truncated
        assert (span.sampling.temperature, span.sampling.top_k) == (0.7, 20)
        assert (span.sampling_source, span.logprobs_mode) == (FROM_REQUEST, None)
        declare_sampling(sample.spans, logprobs_mode=mode)
    counts = sampling_report.SamplingCounts()
    for sample in samples:
        counts.add(sample.spans)
    assert counts.raw_uncorrectable == len(samples)  # what `stats` and `drift` warn about
    figures = behaviour_figures(policy, samples)
    assert figures.naive.mean_abs < 0.1  # looks exact...
    assert figures.corrected.mean_abs > 2 * figures.naive.mean_abs  # ...but is not what sampled


def test_processed_mode_is_exact_with_behaviour_logprobs(
    vllm_processed_url: str, vllm_model: str, policy: Any, tmp_path: Path
) -> None:
    assert _probe(vllm_processed_url, vllm_model) == PROCESSED_LOGPROBS
    samples = _collect(vllm_processed_url, vllm_model, tmp_path)
    for sample in samples:
        declare_sampling(sample.spans, logprobs_mode=PROCESSED_LOGPROBS)
    figures = behaviour_figures(policy, samples)
    assert figures.corrected.tokens >= 0.9 * figures.naive.tokens
    assert figures.corrected.mean_abs < 0.1 and figures.corrected.outside_fraction < 0.05
    assert figures.naive.mean_abs > 2 * figures.corrected.mean_abs
