"""The collector's wiring: which clients and hosts it captures, its settings (read back, and
changed between requests), the assembly mode, and its lifetime (close / aclose / flush)."""

from __future__ import annotations

import httpx2
import openai
import pytest

import tito_agents as tito
from tests.support.capture_replay import (
    BASE_URL,
    Replay,
    load_capture,
    replay_clients,
    run_async,
    run_sync,
)
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples

MSG = [{"role": "user", "content": "x"}]


class CountingSink(MemorySink):
    """A memory sink that counts how often it is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closes = 0

    def close(self) -> None:
        self.closes += 1


def test_official_openai_host_is_refused() -> None:
    """Marking api.openai.com as vLLM is a configuration error, raised at set-up."""
    client = openai.OpenAI(api_key="sk-x")
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        tito.Collector().wrap(client)


def test_wrap_twice_does_not_stack(caplog: pytest.LogCaptureFixture) -> None:
    """Wrapping a client again swaps the collector instead of capturing each call twice; when the
    client was another collector's, that is said (its episodes would just find no calls)."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    first, second = tito.Collector(capture_logprobs=False), tito.Collector(capture_logprobs=False)
    first.wrap(client)
    first.wrap(client)  # the same collector again: nothing to say
    assert not [r for r in caplog.records if "another collector" in r.getMessage()]
    second.wrap(client)
    assert [r for r in caplog.records if "another collector" in r.getMessage()]
    with second.episode() as ep:
        run_sync(client, cap)
    assert len(ep.calls) == 1
    assert first.stats.requests == 0


def test_wrap_refuses_what_is_not_an_openai_client() -> None:
    with pytest.raises(tito.ConfigurationError, match=r"expects an openai\.OpenAI"):
        tito.Collector().wrap(object())


def test_vllm_hosts_are_normalised_and_must_name_one() -> None:
    """Hosts are matched case-insensitively without surrounding blanks; an empty list or the
    official API is refused at set-up, before any request."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client, vllm_hosts=[" VLLM.test:8000 "])
    with collector.episode() as ep:
        run_sync(client, cap)
    assert len(ep.calls) == 1 and replay.received[0]["return_token_ids"] is True
    with pytest.raises(tito.ConfigurationError, match="no vLLM host"):
        collector.wrap(client, vllm_hosts=["", " "])
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        collector.wrap(client, vllm_hosts=["API.openai.com:443"])


def test_the_default_host_is_the_base_url_host_and_port() -> None:
    """Without `vllm_hosts` only the base URL's host:port is vLLM: the same HTTP client sending
    to another port of that host sends the request as it was."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    other_port = client.with_options(base_url="http://vllm.test:9000/v1")
    with collector.episode() as ep:
        other_port.chat.completions.create(model="tiny", messages=MSG)
        run_sync(client, cap)
    assert "return_token_ids" not in replay.received[0]
    assert replay.received[1]["return_token_ids"] is True
    assert len(ep.calls) == 1


def test_http_client_captures_for_frameworks_that_take_one() -> None:
    """`http_client()` builds the openai SDK's own client class (sync or async), capturing."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    collector = tito.Collector(capture_logprobs=False)
    http = collector.http_client(
        ["vllm.test:8000"],
        asynchronous=False,
        transport=httpx2.MockTransport(replay.sync_handler),
    )
    assert isinstance(http, openai.DefaultHttpxClient)
    assert isinstance(collector.http_client(["vllm.test"]), openai.DefaultAsyncHttpxClient)
    client = openai.OpenAI(base_url=BASE_URL, api_key="x", http_client=http)
    with collector.episode() as ep:
        run_sync(client, cap)
    assert len(ep.calls) == 1 and replay.received[0]["return_token_ids"] is True
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        collector.http_client(["api.openai.com"])


async def test_http_client_async_is_captured() -> None:
    cap = load_capture("chat_stream")
    replay = Replay([cap])
    collector = tito.Collector(capture_logprobs=False)
    http = collector.http_client(
        ["vllm.test:8000"], transport=httpx2.MockTransport(replay.async_handler)
    )
    client = openai.AsyncOpenAI(base_url=BASE_URL, api_key="x", http_client=http)
    async with collector.episode() as ep:
        await run_async(client, cap)
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE]
    await client.close()


def test_settings_are_read_back_as_given() -> None:
    """Every constructor argument is read back, as its enum member where it is a choice, on the
    one settings object (the collector forwards none of them)."""
    tokenizer = object()
    collector = tito.Collector(
        errors="count",
        outside_episode="ignore",
        sink_errors="raise",
        session_history="sampled",
        turn_discount=0.5,
        policy_version="v3",
        end_of_turn_id=7,
        rescore_constrained=True,
        record_messages=True,
        keep_messages=False,
        capture_logprobs=True,
        tokenizer=tokenizer,
    )
    settings = collector.settings
    assert settings.errors is tito.ErrorMode.COUNT
    assert settings.outside_episode is tito.OutsideEpisodeMode.IGNORE
    assert settings.sink_errors is tito.SinkErrorMode.RAISE
    assert settings.session_history is tito.SessionHistoryMode.SAMPLED
    assert settings.turn_discount == 0.5
    assert settings.assembly is tito.AssemblyMode.PER_CALL
    assert (settings.policy_version, settings.end_of_turn_id) == ("v3", 7)
    assert settings.rescore_constrained and settings.record_messages and settings.capture_logprobs
    assert settings.keep_messages is False and settings.tokenizer is tokenizer
    public = {name for name in dir(collector) if not name.startswith("_")}
    assert public == {
        "aclose", "close", "default_episode", "episode", "flush", "http_client", "settings",
        "sink", "stats", "wrap",
    }  # fmt: skip


def test_setting_changes_apply_from_the_next_request_on_every_client() -> None:
    """policy_version, capture_logprobs and keep_messages are read per request from settings
    every wrapped client shares: a change between two calls (a weight update) splits them."""
    first_cap, second_cap = load_capture("chat_ns"), load_capture("eos")
    first_replay, second_replay = Replay([first_cap]), Replay([second_cap])
    first, _ = replay_clients(first_replay)
    second, _ = replay_clients(second_replay)
    collector = tito.Collector(capture_logprobs=False, policy_version="v1", keep_messages=True)
    collector.wrap(first)
    collector.wrap(second)
    with collector.episode() as ep:
        first.chat.completions.create(model="tiny", messages=MSG)
        collector.settings.policy_version = "v2"
        collector.settings.capture_logprobs = True
        collector.settings.keep_messages = False
        second.chat.completions.create(model="tiny", messages=MSG)
    before, after = ep.calls
    assert (before.policy_version, after.policy_version) == ("v1", "v2")
    assert "logprobs" not in first_replay.received[0]
    assert second_replay.received[0]["logprobs"] is True and after.logprobs is not None
    assert before.messages is not None and after.messages is None
    samples = captured_samples(collector)
    assert [s.spans[0].policy_version for s in samples] == ["v1", "v2"]


def test_assembly_mode_is_checked_and_can_change_between_episodes() -> None:
    """An unknown mode is refused at construction; the setting takes the mode or its string and
    applies from the next episode ("both": a per-call and a merged sample for one call)."""
    with pytest.raises(tito.ConfigurationError, match="per_call, merged or both"):
        tito.Collector(assembly="merge")
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode("one"):
        run_sync(client, cap)
    collector.settings.assembly = "both"  # type: ignore[assignment]  # a string is accepted
    assert collector.settings.assembly is tito.AssemblyMode.BOTH
    with pytest.raises(ValueError, match="'per_call', 'merged' or 'both'"):
        collector.settings.assembly = "tree"  # type: ignore[assignment]
    assert collector.settings.assembly is tito.AssemblyMode.BOTH
    with collector.episode("two"):
        run_sync(client, cap)
    samples = captured_samples(collector)
    assert [s.episode_id for s in samples] == ["one", "two", "two"]
    assert len({s.sample_id for s in samples}) == 3


def test_close_is_idempotent_and_ends_the_collector() -> None:
    """The sink is closed once however often the collector is; no episode opens afterwards."""
    sink = CountingSink()
    with tito.Collector(sink) as collector:
        pass
    collector.close()
    collector.flush()  # nothing queued: returns at once
    assert sink.closes == 1
    with pytest.raises(tito.ConfigurationError, match="closed"):
        collector.episode()


async def test_aclose_is_idempotent_too() -> None:
    sink = CountingSink()
    async with tito.Collector(sink) as collector:
        pass
    await collector.aclose()
    collector.close()
    assert sink.closes == 1
    with pytest.raises(tito.ConfigurationError, match="closed"):
        collector.episode()
