"""Fixtures: one scripted fake vLLM per session, SDK defaults restored after each test, and a
fresh collector with capture installed for each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import tito_agents_openai_agents as tito_oa
from agents import set_tracing_disabled
from agents.models import _openai_shared
from agents.run import get_default_agent_runner, set_default_agent_runner
from oa_script import new_client, responder

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME


@pytest.fixture(scope="session")
def agents_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=responder)) as server:
        yield server


@pytest.fixture(autouse=True)
def sdk_defaults() -> Iterator[None]:
    """Tests change process-wide SDK settings; put them back (the SDK has no public getter)."""
    client = _openai_shared.get_default_openai_client()
    use_responses = _openai_shared.get_use_responses_by_default()
    runner = get_default_agent_runner()
    yield
    _openai_shared.set_default_openai_client(client)  # type: ignore[arg-type]
    _openai_shared.set_use_responses_by_default(use_responses)
    set_default_agent_runner(runner)
    set_tracing_disabled(False)


@pytest.fixture(params=["responses", "chat_completions"])
def api(request: pytest.FixtureRequest) -> str:
    """Both OpenAI APIs the SDK's models speak: Responses (its default) and Chat Completions."""
    return str(request.param)


@pytest.fixture
async def capture(agents_server: FakeVLLMServer, api: str) -> AsyncIterator[tito_oa.AgentsCapture]:
    """A collector (memory sink) with capture installed on a fresh client as the SDK default."""
    collector = tito.Collector()
    client = new_client(agents_server)
    installed = tito_oa.install(
        collector,
        client,
        model=MODEL_NAME,
        api=api,
        export_traces=False,  # type: ignore[arg-type]
    )
    yield installed
    await client.close()
    collector.close()
