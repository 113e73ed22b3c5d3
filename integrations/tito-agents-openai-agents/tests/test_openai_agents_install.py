"""`install`, the run config, the provider and per-agent rewards."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import tito_agents_openai_agents as tito_oa
from agents import OpenAIChatCompletionsModel, RunConfig, Runner
from agents.models import _openai_shared
from agents.run_config import CallModelData, ModelInputData
from oa_script import build_agents, new_client

import tito_agents as tito
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


async def test_install_from_base_url_sets_the_sdk_default(agents_server: FakeVLLMServer) -> None:
    """install(base_url=...) builds a captured client, makes it the SDK default on chat
    completions, and closes it on aclose()."""
    collector = tito.Collector()
    capture = tito_oa.install(collector, base_url=agents_server.base_url)
    assert _openai_shared.get_default_openai_client() is capture.client
    assert _openai_shared.get_use_responses_by_default() is False
    async with collector.episode() as ep:
        await Runner.run(build_agents(MODEL_NAME).triage, "case-1: weather")
    assert [c.agent for c in ep.calls] == ["triage", "weather", "weather"]
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


def test_provider_resolves_every_name_to_chat_completions_on_the_client() -> None:
    """The provider never reads "org/" as a provider prefix and needs a name from somewhere."""
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="x")
    provider = tito_oa.TitoModelProvider(client, default_model="org/default")
    model = provider.get_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert isinstance(model, OpenAIChatCompletionsModel)
    assert model.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert getattr(provider.get_model(None), "model", None) == "org/default"
    with pytest.raises(tito.ConfigurationError, match="no model name"):
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
        assert all(marker in str(c.messages[0]["content"]) for c in ep.calls)  # type: ignore[index]


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
    samples = capture.collector.sink.samples  # type: ignore[attr-defined]
    assert [(s.agent, s.reward) for s in samples] == [
        ("triage", 0.5),
        ("billing", 1.0),
        ("billing", 1.0),
    ]
