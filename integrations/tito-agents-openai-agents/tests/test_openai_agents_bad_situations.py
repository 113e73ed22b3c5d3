"""Bad situations: mixed APIs, an uncaptured host or client, retries."""

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
from agents.tracing import agent_span, response_span, trace
from oa_script import CALLS_PER_RUN, build_agents, misattributed, new_client

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME


async def test_agents_on_both_apis_in_one_run_are_captured(
    capture: tito_oa.AgentsCapture, api: str
) -> None:
    """A specialist on the other API than the rest (both on the captured client): every call is
    captured, on its own endpoint, with its agent."""
    agents = build_agents(MODEL_NAME)
    other = OpenAIChatCompletionsModel if api == "responses" else OpenAIResponsesModel
    agents.billing.model = other(MODEL_NAME, openai_client=capture.client)
    async with capture.collector.episode() as ep:
        await Runner.run(agents.triage, "case-1: invoice")
    calls = sorted(ep.calls, key=lambda c: c.seq)
    assert [c.agent for c in calls] == ["triage", "billing", "billing"]
    mine, theirs = ("responses", "chat") if api == "responses" else ("chat", "responses")
    assert [c.endpoint.value for c in calls] == [mine, theirs, theirs]
    assert [p for c in calls for p in misattributed(c, "case-1")] == []


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
    assert [s.agent for s in captured_samples(capture.collector)] == ["triage"]
    assert capture.stats.uncaptured_by_agent["billing"] == before.get("billing", 0) + 2


async def test_uncaptured_calls_are_counted_not_raised_when_allowed(
    agents_server: FakeVLLMServer,
) -> None:
    """With uncaptured="count", an uncaptured specialist passes through: counted, no error."""
    collector = tito.Collector()
    client = new_client(agents_server)
    capture = tito_oa.install(collector, client, uncaptured="count", export_traces=False)
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
    samples = captured_samples(capture.collector)
    assert len({s.sample_id for s in samples}) == len(samples) == CALLS_PER_RUN


async def test_sdk_retries_make_no_duplicate_samples(
    agents_server: FakeVLLMServer,
) -> None:
    """A 503 retried by the SDK's own retry policy (the client's retries off) is captured once,
    on the client copy the SDK makes for the retry, labelled with its agent."""
    collector = tito.Collector()
    client = new_client(agents_server, max_retries=0)
    capture = tito_oa.install(collector, client, export_traces=False)
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
    assert len(captured_samples(collector)) == CALLS_PER_RUN
    assert capture.stats.uncaptured_calls == uncaptured


async def test_upstream_vllm_pattern_with_its_own_client_is_named_before_the_call(
    capture: tito_oa.AgentsCapture,
    agents_server: FakeVLLMServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Upstream's custom-model example: an agent on `OpenAIChatCompletionsModel` with its own
    `AsyncOpenAI`, tracing disabled. Tito cannot capture that client, so the label filter names the
    agent and the client's URL with the fix, the episode fails instead of ending with 0 samples,
    and the empty episode is counted."""
    from agents import set_tracing_disabled
    from tito_agents_openai_agents import _stats

    monkeypatch.setattr(_stats, "_WARNED", set())  # logged once per agent per process
    own = new_client(agents_server)  # the example's client, never wrapped
    set_tracing_disabled(True)  # restored by the sdk_defaults fixture
    agent = build_agents(MODEL_NAME).translator
    agent.model = OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=own)
    with pytest.raises(tito.EpisodeCaptureError) as caught:
        async with capture.collector.episode() as ep:
            await Runner.run(agent, "case-9: hello")
    await own.close()
    [error] = caught.value.errors
    assert isinstance(error, tito_oa.UncapturedModelCallError)
    assert (error.agent, error.client_url) == ("translator", str(own.base_url))
    assert "collector.wrap(client)" in str(error)
    assert ep.calls == [] and capture.collector.stats.empty_episodes == 1
    assert (
        f"agent 'translator' goes through an AsyncOpenAI client for {own.base_url}" in caplog.text
    )
    assert "no captured call" in caplog.text


async def test_same_pattern_is_captured_once_the_client_is_installed(
    agents_server: FakeVLLMServer,
) -> None:
    """The fix the error names: `install(collector, client)` on the example's own client."""
    from agents import set_tracing_disabled

    own = new_client(agents_server)
    collector = tito.Collector()
    tito_oa.install(collector, own)
    set_tracing_disabled(True)
    agent = build_agents(MODEL_NAME).translator
    agent.model = OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=own)
    async with collector.episode() as ep:
        await Runner.run(agent, "case-10: hello")
    await own.close()
    assert [c.agent for c in ep.calls] == ["translator"]


async def test_streamed_run_started_before_the_episode_is_reported_by_agent(
    capture: tito_oa.AgentsCapture, caplog: pytest.LogCaptureFixture
) -> None:
    """`Runner.run_streamed` called before `collector.episode()` copies a context with no episode:
    its calls land outside any episode, and the episode's end says so, naming the agents."""
    agents = build_agents(MODEL_NAME)
    result = Runner.run_streamed(agents.triage, "case-11: invoice")  # too early
    async with capture.collector.episode("late") as ep:
        async for _ in result.stream_events():
            pass
    assert ep.calls == [] and capture.collector.stats.empty_episodes == 1
    assert "'late' ended with no captured call, while 3 calls" in caplog.text
    assert "'billing': 2" in caplog.text and "'triage': 1" in caplog.text
    assert "Runner.run_streamed" in caplog.text
