"""`install`, the run config, the provider and per-agent rewards."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import tito_agents_openai_agents as tito_oa
from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig, Runner
from agents.models import _openai_shared
from agents.run_config import CallModelData, ModelInputData
from oa_script import build_agents, new_client, prompt_text

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME


def test_install_needs_exactly_one_async_client_source() -> None:
    """install() refuses no client, both a client and a URL, and a sync client."""
    collector = tito.Collector()
    with pytest.raises(tito.ConfigurationError, match="exactly one"):
        tito_oa.install(collector)
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="x")
    with pytest.raises(tito.ConfigurationError, match="exactly one"):
        tito_oa.install(collector, client, base_url="http://127.0.0.1:1/v1")
    with (
        openai.OpenAI(base_url="http://127.0.0.1:1/v1", api_key="x") as sync_client,
        pytest.raises(tito.ConfigurationError, match="AsyncOpenAI"),
    ):
        tito_oa.install(collector, sync_client)  # type: ignore[arg-type]
    with pytest.raises(tito.ConfigurationError, match="uncaptured"):
        tito_oa.install(collector, client, uncaptured="ignore")  # type: ignore[arg-type]


async def test_install_refuses_the_official_openai_api() -> None:
    """Pointing install() at api.openai.com is a configuration error (it returns no ids)."""
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        tito_oa.install(tito.Collector(), base_url="https://api.openai.com/v1")


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_install_from_base_url_sets_the_sdk_default(
    agents_server: FakeVLLMServer, api: str
) -> None:
    """install(base_url=...) builds a captured client, makes it the SDK default on the chosen API
    (the SDK's own default, Responses, unless told), and closes it on aclose()."""
    collector = tito.Collector()
    capture = tito_oa.install(collector, base_url=agents_server.base_url, api=api)  # type: ignore[arg-type]
    assert _openai_shared.get_default_openai_client() is capture.client
    assert _openai_shared.get_use_responses_by_default() is (api == "responses")
    async with collector.episode() as ep:
        await Runner.run(build_agents(MODEL_NAME).triage, "case-1: weather")
    assert [c.agent for c in ep.calls] == ["triage", "weather", "weather"]
    assert {c.endpoint.value for c in ep.calls} == {"responses" if api == "responses" else "chat"}
    await capture.aclose()
    assert capture.client.is_closed()


async def test_set_default_false_leaves_the_sdk_alone(agents_server: FakeVLLMServer) -> None:
    """With set_default=False nothing global changes; runs given capture.run_config() are
    captured through the provider, even for agents without a model name."""
    previous = _openai_shared.get_default_openai_client()
    collector = tito.Collector()
    client = new_client(agents_server)
    capture = tito_oa.install(collector, client, set_default=False, model=MODEL_NAME)
    assert _openai_shared.get_default_openai_client() is previous
    agents = build_agents(MODEL_NAME)
    agents.triage.model = None
    async with collector.episode() as ep:
        await Runner.run(agents.triage, "case-2: invoice", run_config=capture.run_config())
    await client.close()
    assert [c.agent for c in ep.calls] == ["triage", "billing", "billing"]


def test_provider_resolves_every_name_to_a_model_of_its_api_on_the_client() -> None:
    """The provider never reads "org/" as a provider prefix, builds the model of its API, and
    needs a name from somewhere."""
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="x")
    provider = tito_oa.TitoModelProvider(client, default_model="org/default")
    model = provider.get_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert isinstance(model, OpenAIResponsesModel)
    assert model.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert getattr(provider.get_model(None), "model", None) == "org/default"
    chat = tito_oa.TitoModelProvider(client, default_model="m", api="chat_completions")
    assert isinstance(chat.get_model(None), OpenAIChatCompletionsModel)
    with pytest.raises(tito.ConfigurationError, match="api must be"):
        tito_oa.TitoModelProvider(client, api="completions")  # type: ignore[arg-type]
    with pytest.raises(tito.ConfigurationError, match="names no model"):
        tito_oa.TitoModelProvider(client).get_model(None)


async def test_label_filter_composes_with_user_filters(
    capture: tito_oa.AgentsCapture,
) -> None:
    """A user's filter (sync or async) still shapes the prompt; labels are still set; applying the
    run config twice keeps a single label filter."""

    def shout(data: CallModelData[Any]) -> ModelInputData:
        data.model_data.instructions = f"{data.model_data.instructions} SYNC-EXTRA"
        return data.model_data

    async def whisper(data: CallModelData[Any]) -> ModelInputData:
        data.model_data.instructions = f"{data.model_data.instructions} ASYNC-EXTRA"
        return data.model_data

    for user_filter, marker in ((shout, "SYNC-EXTRA"), (whisper, "ASYNC-EXTRA")):
        base = RunConfig(tracing_disabled=True, call_model_input_filter=user_filter)
        config = capture.run_config(capture.run_config(base))
        label_filter = config.call_model_input_filter
        assert isinstance(label_filter, tito_oa.AgentLabelFilter)
        assert label_filter.inner is user_filter
        async with capture.collector.episode() as ep:
            await Runner.run(build_agents(MODEL_NAME).triage, "case-3: invoice", run_config=config)
        assert [c.agent for c in ep.calls] == ["triage", "billing", "billing"]
        assert all(marker in prompt_text(c) for c in ep.calls)


async def test_rewards_per_agent_reach_the_samples(capture: tito_oa.AgentsCapture) -> None:
    """set_agent_reward gives each agent's calls its own reward; calls_by_agent groups them."""
    async with capture.collector.episode() as ep:
        await Runner.run(build_agents(MODEL_NAME).triage, "case-4: invoice")
        ep.set_reward(0.0)
        assert tito_oa.set_agent_reward(ep, "triage", 0.5) == 1
        assert tito_oa.set_agent_reward(ep, "billing", 1.0) == 2
        assert tito_oa.set_agent_reward(ep, "nobody", 1.0) == 0
        grouped = tito_oa.calls_by_agent(ep)
    assert {agent: len(calls) for agent, calls in grouped.items()} == {"triage": 1, "billing": 2}
    samples = captured_samples(capture.collector)
    assert [(s.agent, s.reward) for s in samples] == [
        ("triage", 0.5),
        ("billing", 1.0),
        ("billing", 1.0),
    ]


async def test_one_line_install_runs_agents_without_a_model(
    agents_server: FakeVLLMServer,
) -> None:
    """`install(collector, base_url=...)` alone: agents that name no model use the first model the
    server lists, in `Runner.run` and `Runner.run_streamed`, neither given a run config."""
    collector = tito.Collector()
    capture = tito_oa.install(collector, base_url=agents_server.base_url)
    agents = build_agents(None)  # type: ignore[arg-type]
    async with collector.episode() as plain:
        await Runner.run(agents.triage, "case-11: invoice")
    async with collector.episode() as streamed:
        result = Runner.run_streamed(agents.manager, "case-12: greet")
        async for _ in result.stream_events():
            pass
    await capture.aclose()
    assert [c.agent for c in plain.calls] == ["triage", "billing", "billing"]
    assert sorted(c.agent for c in streamed.calls) == ["manager", "manager", "translator"]
    assert {c.model for c in plain.calls + streamed.calls} == {MODEL_NAME}
    assert capture.provider.default_model == MODEL_NAME  # looked up once, then kept


def test_one_line_install_covers_run_sync(
    agents_server: FakeVLLMServer, sdk_defaults: None
) -> None:
    """`Runner.run_sync` after the one line: same model, same labels (its own loop: run_sync
    shuts its loop's async generators down after each run, an SDK quirk)."""
    import asyncio

    collector = tito.Collector()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        capture = tito_oa.install(collector, base_url=agents_server.base_url)
        with collector.episode() as ep:
            Runner.run_sync(build_agents(None).triage, "case-13: the weather")  # type: ignore[arg-type]
        loop.run_until_complete(capture.aclose())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert [c.agent for c in ep.calls] == ["triage", "weather", "weather"]
    assert {c.model for c in ep.calls} == {MODEL_NAME}
    collector.close()


async def test_the_given_model_wins_and_a_run_config_keeps_its_provider(
    agents_server: FakeVLLMServer,
) -> None:
    """install(model=...) names the model of agents without one; a run's own RunConfig keeps its
    provider for named models and still gets the label filter."""
    from agents import MultiProvider

    collector = tito.Collector()
    capture = tito_oa.install(collector, base_url=agents_server.base_url, model=MODEL_NAME)
    agents = build_agents(None)  # type: ignore[arg-type]
    agents.billing.model = MODEL_NAME  # named: resolved by the run's own provider
    config = RunConfig(tracing_disabled=True)
    completed = capture.complete(config)
    assert isinstance(completed.model_provider, tito_oa.DefaultModelProvider)
    assert isinstance(completed.model_provider.inner, MultiProvider)
    assert capture.complete(completed).model_provider is completed.model_provider  # idempotent
    async with collector.episode() as ep:
        await Runner.run(agents.triage, "case-14: invoice", run_config=config)
    assert [c.agent for c in ep.calls] == ["triage", "billing", "billing"]
    assert {c.model for c in ep.calls} == {MODEL_NAME}
    await capture.aclose()


def test_trace_export_is_off_for_a_vllm_host_unless_asked(
    agents_server: FakeVLLMServer,
) -> None:
    """With a vLLM base URL the SDK's exporter to OpenAI is dropped (no failed uploads with a
    vLLM key); export_traces=True keeps it; the span map is registered either way, once; other
    processors the user added stay."""
    from agents.tracing import add_trace_processor, set_trace_processors
    from agents.tracing.processors import default_processor
    from sdk_trace import SpanLog
    from tito_agents_openai_agents._install import _trace_processors

    mine = SpanLog()
    set_trace_processors([default_processor(), mine])
    try:
        capture = tito_oa.install(tito.Collector(), base_url=agents_server.base_url)
        assert _trace_processors() == [mine, capture.processor]
        tito_oa.install(tito.Collector(), base_url=agents_server.base_url, export_traces=True)
        assert _trace_processors() == [default_processor(), mine, capture.processor]
        add_trace_processor(capture.processor)  # a user's duplicate is not kept twice
        tito_oa.install(tito.Collector(), base_url=agents_server.base_url)
        assert _trace_processors() == [mine, capture.processor]
    finally:
        set_trace_processors([tito_oa.AgentSpanTracker()])  # the fixture's capture re-registers
        set_trace_processors([capture.processor])
