"""No silent zero capture: an episode that ends with no captured call is counted and logged with
what capture saw while it was open; `integration.captures` tells adapters whether a client they
hold really goes through capture."""

from __future__ import annotations

import logging

import openai
import pytest

import tito_agents as tito
from tests.support.capture_replay import Replay, load_capture, replay_clients, run_sync
from tito_agents import integration


def test_episode_without_any_request_is_counted_and_names_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An agent whose client is not wrapped: the episode ends empty, is counted, and the warning
    says no call reached a capturing client and how to fix it."""
    replay = Replay([load_capture("chat_ns")])
    client, _ = replay_clients(replay)  # never wrapped
    collector = tito.Collector()
    with caplog.at_level(logging.WARNING, "tito_agents"), collector.episode("e1") as ep:
        run_sync(client, load_capture("chat_ns"))
    assert len(replay.received) == 1 and ep.calls == []
    assert collector.stats.empty_episodes == 1
    assert "'e1' ended with no captured call" in caplog.text
    assert "collector.wrap(client)" in caplog.text


def test_calls_outside_the_episode_while_it_was_open_are_named_by_agent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run that went on outside the episode's context (its calls landed outside any episode,
    as an early-started streamed run's do) while the episode was open: the warning counts those
    calls per agent; calls from before the episode opened are not counted."""
    replay = Replay([load_capture("chat_ns")] * 3)
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with tito.agent("earlier"):
        run_sync(client, load_capture("chat_ns"))
    collector.flush()
    episode = collector.episode("e3")
    with caplog.at_level(logging.WARNING, "tito_agents"):
        with tito.agent("router"):  # outside any episode, while e3 is open
            run_sync(client, load_capture("chat_ns"))
            run_sync(client, load_capture("chat_ns"))
        with episode:
            pass
    assert collector.stats.empty_episodes == 1
    assert "'e3' ended with no captured call, while 2 calls" in caplog.text
    assert "'router': 2" in caplog.text and "earlier" not in caplog.text
    assert "Runner.run_streamed" in caplog.text


def test_an_episode_with_calls_or_a_failed_body_is_not_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only an episode that ended normally with no call is reported."""
    client, _ = replay_clients(Replay([load_capture("chat_ns")]))
    collector = tito.Collector()
    collector.wrap(client)
    with caplog.at_level(logging.WARNING, "tito_agents"):
        with collector.episode():
            run_sync(client, load_capture("chat_ns"))
        with pytest.raises(RuntimeError), collector.episode():
            raise RuntimeError("agent crashed before any call")
    assert collector.stats.empty_episodes == 0
    assert "no captured call" not in caplog.text


def test_captures_tells_a_wrapped_client_from_others() -> None:
    """True only for a wrapped client whose own host is one of its vLLM hosts."""
    wrapped = openai.OpenAI(base_url="http://vllm.test:8000/v1", api_key="x")
    other_host = openai.OpenAI(base_url="http://proxy.test:9000/v1", api_key="x")
    plain = openai.OpenAI(base_url="http://vllm.test:8000/v1", api_key="x")
    collector = tito.Collector()
    collector.wrap(wrapped)
    collector.wrap(other_host, vllm_hosts=["vllm.test:8000"])
    assert integration.captures(wrapped)
    assert not integration.captures(other_host)
    assert not integration.captures(plain)
    assert not integration.captures(object())
