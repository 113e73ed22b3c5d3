"""`install` itself: the versions it supports, the hosts it is given, one install at a time, and
calls that miss capture counted rather than silent."""

from __future__ import annotations

import importlib.metadata

import httpx
import litellm
import pytest
import tito_agents_litellm
from litellm_support import PREFIXES, acomplete, complete, host_of

import tito_agents as tito
from tito_agents.integration import captures
from tito_agents.testing.fake_vllm import FakeVLLMServer


@pytest.mark.parametrize("version", ["1.109.3", "1.111.0", "2.0", "unknown"])
def test_an_unsupported_litellm_is_named_with_the_supported_ones(version: str) -> None:
    with pytest.raises(tito.ConfigurationError) as raised:
        tito_agents_litellm.check_litellm_version(version)
    assert f"litellm {version} is not supported" in str(raised.value)
    assert tito_agents_litellm.SUPPORTED_LITELLM in str(raised.value)


def test_install_refuses_an_unsupported_litellm_before_hooking_it(
    collector: tito.Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    callbacks = list(litellm.callbacks)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.82.0")
    with pytest.raises(tito.ConfigurationError, match=r"litellm 1\.82\.0 is not supported"):
        tito_agents_litellm.install(collector, vllm_hosts=["127.0.0.1:8000"])
    assert litellm.callbacks == callbacks


def test_the_supported_releases_pass() -> None:
    tito_agents_litellm.check_litellm_version("1.110.0")
    tito_agents_litellm.check_litellm_version("1.110.2")
    tito_agents_litellm.check_litellm_version()  # the installed one


def test_install_checks_its_hosts_at_once(collector: tito.Collector) -> None:
    callbacks = list(litellm.callbacks)
    with pytest.raises(tito.ConfigurationError, match="vllm_hosts"):
        tito_agents_litellm.install(collector, vllm_hosts=[])
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        tito_agents_litellm.install(collector, vllm_hosts=["api.openai.com"])
    assert litellm.callbacks == callbacks  # nothing was hooked


async def test_vllm_hosts_may_be_the_api_base_itself(
    vllm: FakeVLLMServer, collector: tito.Collector
) -> None:
    with tito_agents_litellm.install(collector, vllm_hosts=[vllm.base_url]) as capture:
        assert capture.vllm_hosts == {host_of(vllm)}
        async with collector.episode() as ep:
            await acomplete(vllm, "hosted_vllm", "url", stream=False)
    assert len(ep.calls) == 1


async def test_a_second_install_replaces_the_first(
    vllm: FakeVLLMServer, collector: tito.Collector
) -> None:
    """One install at a time: the second uninstalls the first, so calls go to the new collector
    only, and the counter is registered once."""
    callbacks = list(litellm.callbacks)
    first = tito_agents_litellm.install(collector, vllm_hosts=[host_of(vllm)])
    other = tito.Collector()
    second = tito_agents_litellm.install(other, vllm_hosts=[host_of(vllm)])
    try:
        assert not first.installed
        assert len(litellm.callbacks) == len(callbacks) + 1
        async with collector.episode() as mine, other.episode() as theirs:
            await acomplete(vllm, "hosted_vllm", "second", stream=False)
        assert (len(mine.calls), len(theirs.calls)) == (0, 1)
    finally:
        second.uninstall()
        other.close()
    assert litellm.callbacks == callbacks


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_calls_are_counted_in_their_episode(
    vllm: FakeVLLMServer,
    collector: tito.Collector,
    capture: tito_agents_litellm.LiteLLMCapture,
    prefix: str,
) -> None:
    """Each call LiteLLM sends to vLLM is counted, and matches a captured request: no miss."""
    async with collector.episode() as ep:
        complete(vllm, prefix, "counted", stream=True)
        await acomplete(vllm, prefix, "counted", stream=False)
    assert len(ep.calls) == 2
    assert ep.report.bypassed_calls == 0


async def test_a_call_that_misses_capture_is_reported(
    vllm: FakeVLLMServer, collector: tito.Collector, caplog: pytest.LogCaptureFixture
) -> None:
    """A `vllm_hosts` entry that is not the `api_base` (another port): the `hosted_vllm/` call
    reaches vLLM uncaptured, and the episode says so (counted, logged with LiteLLM's fix)."""
    wrong = f"{host_of(vllm).split(':')[0]}:1"
    with tito_agents_litellm.install(collector, vllm_hosts=[wrong]):
        async with collector.episode() as ep:
            await acomplete(vllm, "hosted_vllm", "missed", stream=False)
    assert ep.calls == []
    assert ep.report.bypassed_calls == 1
    assert collector.stats.bypassed_calls == 1
    assert "tito_agents_litellm.install" in caplog.text


def test_wrap_takes_an_httpx_client_itself(collector: tito.Collector) -> None:
    """The core piece the hooks use: `Collector.wrap` of a plain httpx client, in place."""
    with httpx.Client() as client:
        assert collector.wrap(client, vllm_hosts=["127.0.0.1:8000"]) is client
        assert type(client._transport).__module__.startswith("tito_agents")
    with pytest.raises(tito.ConfigurationError, match="vllm_hosts is required"):
        collector.wrap(httpx.AsyncClient())
    assert not captures(httpx.Client())
