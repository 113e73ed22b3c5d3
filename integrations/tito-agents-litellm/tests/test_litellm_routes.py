"""Every route LiteLLM has to vLLM is captured once `install` ran: both prefixes, sync and async,
streamed and not, with the exact ids; and nothing is captured without it."""

from __future__ import annotations

import httpx
import litellm
import openai
import pytest
import tito_agents_litellm
from litellm.llms.custom_httpx.http_handler import HTTPHandler
from litellm_support import PREFIXES, acomplete, call_kwargs, complete, host_of, marker_of

import tito_agents as tito
from tito_agents.calls import CallStatus, SessionNote
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer


def _assert_one_exact_call(ep: tito.Episode, marker: str, *, stream: bool, text: str) -> None:
    assert len(ep.calls) == 1
    call = ep.calls[0]
    assert call.status is CallStatus.COMPLETE
    assert call.stream is stream
    assert call.episode_id == ep.episode_id
    assert marker_of(call) == marker
    assert len(call.prompt_ids) > 0
    assert len(call.sampled_ids) > 0
    assert text  # the caller still gets the answer


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_sync_calls_are_captured(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
    prefix: str,
    stream: bool,
) -> None:
    with collector.episode() as ep:
        text = complete(vllm, prefix, "sync", stream=stream)
    _assert_one_exact_call(ep, "sync", stream=stream, text=text)
    samples = captured_samples(collector)
    assert [s.episode_id for s in samples] == [ep.episode_id]
    assert len(samples[0].token_ids) > 0


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("prefix", PREFIXES)
async def test_async_calls_are_captured(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
    prefix: str,
    stream: bool,
) -> None:
    async with collector.episode() as ep:
        text = await acomplete(vllm, prefix, "async", stream=stream)
    _assert_one_exact_call(ep, "async", stream=stream, text=text)


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_clients_cached_before_install_are_captured(
    vllm: FakeVLLMServer, collector: tito.Collector, prefix: str
) -> None:
    """LiteLLM caches its clients: the ones the first calls built (sync and async) are the ones
    later calls reuse, and install reaches them."""
    complete(vllm, prefix, "warm", stream=False)
    await acomplete(vllm, prefix, "warm", stream=True)
    with tito_agents_litellm.install(collector, vllm_hosts=[host_of(vllm)]):
        async with collector.episode() as ep:
            complete(vllm, prefix, "cached", stream=False)
            await acomplete(vllm, prefix, "cached", stream=True)
    assert [(c.stream, marker_of(c)) for c in ep.calls] == [(False, "cached"), (True, "cached")]


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_nothing_is_captured_without_install(
    vllm: FakeVLLMServer, collector: tito.Collector, prefix: str
) -> None:
    """The control: plain LiteLLM sends around capture (so the tests above can fail)."""
    async with collector.episode() as ep:
        complete(vllm, prefix, "plain", stream=False)
        await acomplete(vllm, prefix, "plain", stream=True)
    assert ep.calls == []


async def test_uninstall_puts_litellm_back(vllm: FakeVLLMServer, collector: tito.Collector) -> None:
    """After uninstall the hooks are LiteLLM's own again, its calls are no longer counted, and
    the clients install wrapped send around capture."""
    handler_client = litellm.llms.custom_httpx.http_handler.HTTPHandler.__dict__["client"]
    get_openai_client = litellm.llms.openai.openai.OpenAIChatCompletion.__dict__[
        "_get_openai_client"
    ]
    capture = tito_agents_litellm.install(collector, vllm_hosts=[host_of(vllm)])
    assert capture.installed
    for prefix in PREFIXES:
        complete(vllm, prefix, "on", stream=False)
        await acomplete(vllm, prefix, "on", stream=False)
    capture.uninstall()
    capture.uninstall()  # idempotent
    assert not capture.installed
    assert litellm.llms.custom_httpx.http_handler.HTTPHandler.__dict__["client"] is handler_client
    assert (
        litellm.llms.openai.openai.OpenAIChatCompletion.__dict__["_get_openai_client"]
        is get_openai_client
    )
    async with collector.episode() as ep:
        for prefix in PREFIXES:
            complete(vllm, prefix, "off", stream=False)
            await acomplete(vllm, prefix, "off", stream=True)
    assert ep.calls == []
    assert ep.report.bypassed_calls == 0  # the call counter went with the hooks


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_token_in_sessions_on_both_routes(
    vllm: FakeVLLMServer, collector: tito.Collector, prefix: str
) -> None:
    """`sessions=True`: a conversation's second turn is sent as token ids extending the first
    (the planner's own requests go through LiteLLM's transport, aiohttp included)."""
    with tito_agents_litellm.install(collector, vllm_hosts=[host_of(vllm)], sessions=True):
        async with collector.episode() as ep:
            kwargs = call_kwargs(vllm, prefix, "session")
            first = await litellm.acompletion(**kwargs)
            kwargs["messages"] = [
                *kwargs["messages"],
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "session: again"},
            ]
            stream = await litellm.acompletion(**kwargs, stream=True)
            async for _ in stream:
                pass
    assert [c.session for c in ep.calls] == [SessionNote.FIRST, SessionNote.TOKEN_IN_BRIDGED]


@pytest.mark.parametrize("aiohttp", [True, False], ids=["aiohttp", "httpx"])
async def test_both_async_transports_are_captured(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
    monkeypatch: pytest.MonkeyPatch,
    aiohttp: bool,
) -> None:
    """LiteLLM's async handlers send over aiohttp by default, over httpx with
    `litellm.disable_aiohttp_transport`: capture sits in front of either (a new event loop gets
    a new handler, built under the setting)."""
    monkeypatch.setattr(litellm, "disable_aiohttp_transport", not aiohttp)
    async with collector.episode() as ep:
        await acomplete(vllm, "hosted_vllm", "transport", stream=True)
    assert len(ep.calls) == 1
    inner = {type(transport).__name__ for _, transport, _ in capture._originals.values()}
    assert ("LiteLLMAiohttpTransport" in inner) is aiohttp


async def test_a_client_passed_per_call_is_captured(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
) -> None:
    """`client=`: a LiteLLM handler on the `hosted_vllm/` route (one built on the caller's own
    httpx client too), an openai client on the `openai/` route."""
    own = httpx.Client()
    handlers = [HTTPHandler(), HTTPHandler(client=own)]
    async_openai = openai.AsyncOpenAI(base_url=vllm.base_url, api_key="EMPTY")
    async with collector.episode() as ep:
        for handler in handlers:
            litellm.completion(**call_kwargs(vllm, "hosted_vllm", "given"), client=handler)
        await litellm.acompletion(**call_kwargs(vllm, "openai", "given"), client=async_openai)
    assert [marker_of(c) for c in ep.calls] == ["given"] * 3
    await async_openai.close()
    handlers[0].close()
    own.close()
