"""Anthropic Messages clients through the gateway over real HTTP: the official `anthropic` SDK,
given the gateway's episode URL (or the `X-Tito-*` headers) as its base URL and nothing else, as
Claude-Code-style harnesses are given `ANTHROPIC_BASE_URL`. Calls are captured on every URL form,
streams relayed as Messages events, `count_tokens` forwarded, the query string kept on what goes
upstream as written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

import tito_agents as tito
from tests.support.gateway_harness import RecordingUpstream, ServedGateway
from tests.support.sessions_fake import responder
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM
from tito_agents.testing.smollm2 import MODEL_NAME

TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "description": "Weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
BETA = {"beta": "true"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream(FakeVLLM(FakeConfig(responder=responder))) as server:
        yield server


@pytest.fixture
def served(upstream: RecordingUpstream) -> Iterator[ServedGateway]:
    upstream.requests.clear()
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, upstream.base_url, read_timeout=10.0) as gateway:
        yield gateway
    collector.close()


@pytest.mark.parametrize("form", ["episode path", "agent path", "header"])
def test_messages_calls_on_every_url_form_become_exact_samples(
    served: ServedGateway, upstream: RecordingUpstream, form: str
) -> None:
    control = served.control()
    opened = control.open("ep-1")
    headers: dict[str, str] = {}
    if form == "episode path":
        base = served.url + opened["base_url"].removesuffix("/v1")
    elif form == "agent path":
        base = f"{served.url}/episodes/ep-1/agents/solver"
    else:
        base, headers = served.url, {"X-Tito-Episode": "ep-1", "X-Tito-Agent": "solver"}
    client = anthropic.Anthropic(base_url=base, api_key="key", default_headers=headers)
    with client:
        body = client.messages.create(model=MODEL_NAME, max_tokens=64, messages=ASK, tools=TOOLS)
        with client.messages.stream(
            model=MODEL_NAME, max_tokens=64, messages=ASK, tools=TOOLS
        ) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
    assert body.stop_reason == final.stop_reason == "tool_use"
    assert body.content[0].model_dump(exclude={"id"}) == final.content[0].model_dump(exclude={"id"})
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    report = control.close("ep-1")
    assert (report["calls"], report["complete"], report["samples"]) == (2, 2, 2), report
    samples = captured_samples(served.collector)
    assert len(samples) == 2
    assert {s.agent for s in samples} == ({None} if form == "episode path" else {"solver"})
    assert upstream.paths() == [b"/v1/chat/completions"] * 2


def test_count_tokens_and_uncaptured_calls_are_forwarded_with_their_query(
    served: ServedGateway, upstream: RecordingUpstream
) -> None:
    """`count_tokens` is forwarded (not a call); a Messages call capture leaves to the server goes
    to `/v1/messages` with its query (Claude Code's `?beta=true`); a captured one goes as chat."""
    client = anthropic.Anthropic(base_url=f"{served.url}/episodes/ep-2", api_key="key")
    served.control().open("ep-2")
    with client:
        counted = client.messages.count_tokens(model=MODEL_NAME, messages=ASK, extra_query=BETA)
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model=MODEL_NAME, max_tokens=0, messages=ASK, extra_query=BETA)
        client.messages.create(model=MODEL_NAME, max_tokens=8, messages=ASK, extra_query=BETA)
    assert counted.input_tokens > 0
    assert [target for _, target in upstream.requests] == [
        b"/v1/messages/count_tokens?beta=true",
        b"/v1/messages?beta=true",
        b"/v1/chat/completions",
    ]
    report = served.control().close("ep-2")
    assert (report["calls"], report["complete"]) == (1, 1), report
    assert served.collector.stats.uncaptured_requests == 1
