"""Responses API calls returned without logprobs, on the fake vLLM over HTTP: vLLM 0.32 gives
none for output tokens that became function calls (nor a stream's EOS), so such calls have exact
ids and `logprobs=None`. With re-scoring on they get the policy's own logprobs from the same
server, flagged `rescored`, and merged samples holding them get `policy_logprobs` on every trained
token; without it, they keep no logprobs (never a silent fill)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.rescore_fake import rescore_independently
from tests.support.sessions_fake import responder
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=responder)) as srv:
        yield srv


def tool_episode(
    client: openai.OpenAI, collector: tito.Collector, *, stream: bool = False
) -> tito.Episode:
    """A free (tool_choice auto) function call, its output, then a text answer."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    with collector.episode() as episode:
        episode.reward = 1.0
        for _ in range(2):
            ask: dict[str, Any] = dict(model=MODEL_NAME, input=items, tools=[TOOL])
            if stream:
                with client.responses.stream(**ask) as events:
                    response = events.get_final_response()
            else:
                response = client.responses.create(**ask)
            items += [item.model_dump(exclude_none=True) for item in response.output]
            for item in response.output:
                if item.type == "function_call":
                    items.append(
                        {"type": "function_call_output", "call_id": item.call_id, "output": "18C"}
                    )
    return episode


def collector_for(rescore: bool) -> tito.Collector:
    return tito.Collector(
        capture_logprobs=True,
        rescore_constrained=rescore,
        assembly="merged",
        tokenizer=load_tokenizer(),
    )


def client_for(server: FakeVLLMServer, collector: tito.Collector) -> openai.OpenAI:
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    return collector.wrap(client, sessions=True)


def test_calls_without_logprobs_are_rescored_and_flagged(server: FakeVLLMServer) -> None:
    collector = collector_for(rescore=True)
    episode = tool_episode(client_for(server, collector), collector)
    (sample,) = captured_samples(collector)  # one merged sample: the session kept the prefix
    tool_span, text_span = sample.spans
    # the function-call turn came back without logprobs: re-scored, flagged, not filled in
    assert (tool_span.constrained, tool_span.logprob_source, tool_span.rescore_error) == (
        None,
        "rescored",
        None,
    )
    assert text_span.logprob_source == "policy"
    assert sample.logprobs is None  # the rollout logprobs stay what the server returned
    assert sample.policy_logprobs is not None and sample.ratio_logprobs() is sample.policy_logprobs
    trained = sample.loss_mask == 1
    policy = rescore_independently(server, sample)
    np.testing.assert_allclose(sample.policy_logprobs[trained], policy[trained], atol=1e-6)
    tool_call, text_call = sorted(episode.calls, key=lambda c: c.seq)
    assert tool_call.tool_calls and tool_call.logprobs is None
    assert tool_call.policy_logprobs is not None
    # on the text span the policy logprobs are the rollout logprobs the server returned
    assert text_call.logprobs is not None and text_call.policy_logprobs is None
    assert np.array_equal(
        sample.policy_logprobs[text_span.start : text_span.end], text_call.logprobs
    )
    stats = collector.stats
    assert (stats.constrained_calls, stats.rescored_calls, stats.rescore_failures) == (0, 1, 0)


def test_text_span_keeps_its_rollout_logprobs(server: FakeVLLMServer) -> None:
    """Only the call without logprobs is re-scored; a call with them is not sent again."""
    collector = collector_for(rescore=True)
    client = client_for(server, collector)
    with collector.episode() as ep:
        client.responses.create(model=MODEL_NAME, input="Say hello.")
    (call,) = ep.calls
    assert call.logprobs is not None and call.policy_logprobs is None
    assert collector.stats.rescored_calls == 0
    (sample,) = captured_samples(collector)
    assert sample.spans[0].logprob_source == "policy" and sample.policy_logprobs is None


def test_streamed_calls_without_logprobs_are_rescored(server: FakeVLLMServer) -> None:
    """A stream's logprobs come per text delta (none for the EOS): the call has none, and is
    re-scored like a function call."""
    collector = collector_for(rescore=True)
    tool_episode(client_for(server, collector), collector, stream=True)
    (sample,) = captured_samples(collector)
    assert [s.logprob_source for s in sample.spans] == ["rescored", "rescored"]
    assert sample.policy_logprobs is not None
    trained = sample.loss_mask == 1
    policy = rescore_independently(server, sample)
    np.testing.assert_allclose(sample.policy_logprobs[trained], policy[trained], atol=1e-6)
    assert collector.stats.rescored_calls == 2


def test_without_rescoring_missing_logprobs_stay_missing(server: FakeVLLMServer) -> None:
    collector = collector_for(rescore=False)
    tool_episode(client_for(server, collector), collector)
    (sample,) = captured_samples(collector)
    assert [s.logprob_source for s in sample.spans] == [None, "policy"]
    assert sample.logprobs is None and sample.policy_logprobs is None
    assert sample.ratio_logprobs() is None
    assert collector.stats.rescored_calls == 0


def test_calls_that_asked_for_no_logprobs_are_not_rescored(server: FakeVLLMServer) -> None:
    collector = tito.Collector(rescore_constrained=True)
    tool_episode(client_for(server, collector), collector)
    assert collector.stats.rescored_calls == 0
    assert all(s.logprob_source is None for s in captured_samples(collector)[0].spans)


def test_a_server_that_cannot_rescore_leaves_a_reason() -> None:
    collector = collector_for(rescore=True)
    with FakeVLLMServer(FakeConfig(responder=responder)) as gone:
        client = client_for(gone, collector)
        episode = collector.episode()
        episode.__enter__()
        client.responses.create(model=MODEL_NAME, input="Weather in Paris?", tools=[TOOL])
    episode.__exit__(None, None, None)  # the server is down when the episode ends
    (sample,) = captured_samples(collector)
    (span,) = sample.spans
    assert span.logprob_source is None
    assert span.rescore_error is not None and "request failed" in span.rescore_error
    assert sample.policy_logprobs is None
    assert collector.stats.rescore_failures == 1
