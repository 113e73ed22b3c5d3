"""What a collector is told about the server's sampling reaches every call and span: the
logprobs mode a trainer needs to know whether logprobs are those of the distribution that
sampled, and the defaults the server fills into fields a request leaves out."""

from __future__ import annotations

import openai
import pytest

import tito_agents as tito
from tito_agents.errors import ConfigurationError
from tito_agents.sampling import DECLARED, FROM_REQUEST, PROCESSED_LOGPROBS, probe_logprobs_mode
from tito_agents.testing import MODEL_NAME, FakeVLLMServer, captured_samples


@pytest.fixture(scope="module")
def server():
    with FakeVLLMServer() as srv:
        yield srv


def _one_call(collector: tito.Collector, server: FakeVLLMServer, **extra: object) -> tito.Sample:
    client = collector.wrap(openai.OpenAI(base_url=server.base_url, api_key="x"))
    with collector.episode() as ep:
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            **extra,
        )
        ep.set_reward(1.0)
    (sample,) = captured_samples(collector)
    return sample


def test_declared_mode_and_defaults_reach_every_span(server) -> None:
    collector = tito.Collector(
        capture_logprobs=True,
        logprobs_mode=PROCESSED_LOGPROBS,
        sampling_defaults={"temperature": 0.6, "top_p": 0.9},
    )
    sample = _one_call(collector, server)
    (span,) = sample.spans
    assert span.logprobs_mode == PROCESSED_LOGPROBS
    assert span.sampling_source == DECLARED
    assert span.sampling is not None
    assert (span.sampling.temperature, span.sampling.top_p) == (0.6, 0.9)
    assert span.truncated


def test_a_request_value_wins_over_a_declared_default(server) -> None:
    collector = tito.Collector(sampling_defaults={"temperature": 0.6})
    (span,) = _one_call(collector, server, temperature=1.0).spans
    assert span.sampling is not None and span.sampling.temperature == 1.0


def test_nothing_declared_means_request_values_and_no_mode(server) -> None:
    collector = tito.Collector()
    (span,) = _one_call(collector, server, extra_body={"top_k": 20}).spans
    assert span.logprobs_mode is None
    assert span.sampling_source == FROM_REQUEST
    assert span.sampling is not None and span.sampling.top_k == 20


def test_a_changed_setting_applies_from_the_next_call(server) -> None:
    collector = tito.Collector()
    collector.settings.server_sampling = tito.sampling.ServerSampling(
        logprobs_mode=PROCESSED_LOGPROBS
    )
    (span,) = _one_call(collector, server).spans
    assert span.logprobs_mode == PROCESSED_LOGPROBS


def test_an_unknown_mode_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="logprobs_mode"):
        tito.Collector(logprobs_mode="softmaxed")


def test_probe_of_an_unreachable_server_says_unknown() -> None:
    assert probe_logprobs_mode("http://127.0.0.1:9/v1", "m", timeout=2) is None
