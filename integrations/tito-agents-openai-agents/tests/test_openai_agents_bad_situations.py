"""Bad situations: a Responses-API model, an uncaptured host or client, retries."""

from __future__ import annotations

import pytest
import tito_agents_openai_agents as tito_oa
from agents import (
    ModelRetrySettings,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    retry_policies,
)
from agents.run_config import CallModelData, ModelInputData
from agents.tracing import agent_span, response_span, trace
from oa_script import CALLS_PER_RUN, build_agents, misattributed, new_client

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME


async def test_responses_model_is_refused_before_any_request(
    capture: tito_oa.AgentsCapture, agents_server: FakeVLLMServer
) -> None:
    """An agent on `OpenAIResponsesModel` fails the run with `ResponsesAPIError` before its call
    is sent, after the calls of the agents before it were captured."""
    agents = build_agents(MODEL_NAME)
    agents.billing.model = OpenAIResponsesModel(MODEL_NAME, openai_client=capture.client)
    before = agents_server.stats["/v1/responses"]
    seen = capture.stats.responses_api_calls
    with pytest.raises(tito_oa.ResponsesAPIError, match=r"'billing'.*Responses API"):
        async with capture.collector.episode() as ep:
            await Runner.run(agents.triage, "case-1: invoice", run_config=capture.run_config())
    assert agents_server.stats["/v1/responses"] == before
    assert [c.agent for c in ep.calls] == ["triage"]
    assert capture.stats.responses_api_calls == seen + 1


async def test_responses_model_passes_through_counted_when_allowed(
    capture: tito_oa.AgentsCapture,
) -> None:
    """With uncaptured="count" the label filter lets a Responses-API agent through, counted."""
    agents = build_agents(MODEL_NAME)
    agents.billing.model = OpenAIResponsesModel(MODEL_NAME, openai_client=capture.client)
    config = tito_oa.with_agent_labels(RunConfig(), uncaptured="count")
    seen = capture.stats.responses_api_calls
    data = ModelInputData(input=[], instructions="x")
    assert config.call_model_input_filter is not None
    out = config.call_model_input_filter(CallModelData(data, agents.billing, None))
    assert out is data
    assert capture.stats.responses_api_calls == seen + 1


@pytest.mark.parametrize("how", ["unwrapped client", "host not listed as vLLM"])
async def test_uncaptured_agent_fails_the_episode_after_writing_good_samples(
    capture: tito_oa.AgentsCapture, agents_server: FakeVLLMServer, how: str
) -> None:
    """A specialist whose calls escape capture makes the episode raise `EpisodeCaptureError`
    naming it, while the triage call's sample is still written."""
    agents = build_agents(MODEL_NAME)
    other = new_client(agents_server)
    if how == "host not listed as vLLM":
        tito.Collector().wrap(other, vllm_hosts=["vllm.internal:8000"])
    agents.billing.model = OpenAIChatCompletionsModel(MODEL_NAME, openai_client=other)
    before = dict(capture.stats.uncaptured_by_agent)
    with pytest.raises(tito.EpisodeCaptureError) as caught:
        async with capture.collector.episode() as ep:
            await Runner.run(agents.triage, "case-2: invoice")
    await other.close()
    assert all(isinstance(e, tito_oa.UncapturedModelCallError) for e in caught.value.errors)
    assert [e.agent for e in caught.value.errors] == ["billing", "billing"]  # type: ignore[attr-defined]
    assert [c.agent for c in ep.calls] == ["triage"]
    assert [s.agent for s in capture.collector.sink.samples] == ["triage"]  # type: ignore[attr-defined]
    assert capture.stats.uncaptured_by_agent["billing"] == before.get("billing", 0) + 2


async def test_uncaptured_calls_are_counted_not_raised_when_allowed(
    agents_server: FakeVLLMServer,
) -> None:
    """With uncaptured="count", an uncaptured specialist passes through: counted, no error."""
    collector = tito.Collector()
    client = new_client(agents_server)
    capture = tito_oa.install(collector, client, uncaptured="count", replace_trace_processors=True)
    other = new_client(agents_server)
    agents = build_agents(MODEL_NAME)
    agents.billing.model = OpenAIChatCompletionsModel(MODEL_NAME, openai_client=other)
    before = capture.stats.uncaptured_by_agent.get("billing", 0)
    async with collector.episode() as ep:
        await Runner.run(agents.triage, "case-3: invoice")
    await other.close()
    await client.close()
    assert not ep.errors and [c.agent for c in ep.calls] == ["triage"]
    assert capture.stats.uncaptured_by_agent["billing"] == before + 2


async def test_responses_span_without_capture_is_an_episode_error(
    capture: tito_oa.AgentsCapture,
) -> None:
    """A Responses-API model call seen only in tracing (a `response` span that sent no captured
    request, as `OpenAIResponsesModel` makes) becomes an error of the running episode."""
    async with capture.collector.episode() as ep:
        with trace("judge run"), agent_span("judge"), response_span():
            pass
        errors = list(ep.errors)
        ep.errors.clear()  # keep the episode's exit quiet; the error itself is what is checked
    assert [(type(e), e.agent, e.kind) for e in errors] == [  # type: ignore[attr-defined]
        (tito_oa.UncapturedModelCallError, "judge", "response")
    ]


async def test_client_retries_make_no_duplicate_samples(
    capture: tito_oa.AgentsCapture, agents_server: FakeVLLMServer
) -> None:
    """A 503 retried by the openai client is a failed attempt, not a call: one sample per call."""
    faults = agents_server.faults
    faults.status_before_body, faults.status_before_body_count, faults.retry_after_ms = 503, 1, 1
    try:
        async with capture.collector.episode() as ep:
            await Runner.run(build_agents(MODEL_NAME).triage, "case-4: invoice")
    finally:
        faults.status_before_body, faults.retry_after_ms = None, None
    assert capture.collector.stats.failed_attempts == 1
    assert [c.agent for c in ep.calls] == ["triage", "billing", "billing"]
    samples = capture.collector.sink.samples  # type: ignore[attr-defined]
    assert len({s.sample_id for s in samples}) == len(samples) == CALLS_PER_RUN


async def test_sdk_retries_make_no_duplicate_samples(
    agents_server: FakeVLLMServer,
) -> None:
    """A 503 retried by the SDK's own retry policy (the client's retries off) is captured once,
    on the client copy the SDK makes for the retry, labelled with its agent."""
    collector = tito.Collector()
    client = new_client(agents_server, max_retries=0)
    capture = tito_oa.install(collector, client, replace_trace_processors=True)
    retry = ModelRetrySettings(max_retries=2, policy=retry_policies.http_status([503]))
    config = capture.run_config(RunConfig(model_settings=ModelSettings(retry=retry)))
    faults = agents_server.faults
    faults.status_before_body, faults.status_before_body_count = 503, 1
    uncaptured = capture.stats.uncaptured_calls
    try:
        async with collector.episode() as ep:
            await Runner.run(build_agents(MODEL_NAME).triage, "case-5: invoice", run_config=config)
    finally:
        faults.status_before_body = None
    await client.close()
    assert collector.stats.failed_attempts == 1
    assert [p for c in ep.calls for p in misattributed(c, "case-5")] == []
    assert len(collector.sink.samples) == CALLS_PER_RUN  # type: ignore[attr-defined]
    assert capture.stats.uncaptured_calls == uncaptured
