"""No silent zero capture: an episode that ends with no captured call is counted and logged with
what capture saw while it was open; `integration.captures` tells adapters whether a client they
hold really goes through capture."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.support.capture_replay import Replay, load_capture, replay_clients, run_sync
from tito_agents import integration
from tito_agents.config import EmptyEpisodeCause


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
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT
    assert collector.stats.empty_episode_causes == {EmptyEpisodeCause.NO_CAPTURING_CLIENT: 1}


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
    assert episode.report.empty_cause is EmptyEpisodeCause.OUTSIDE_EPISODE


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


def _fake_framework(monkeypatch: pytest.MonkeyPatch, name: str, **attributes: Any) -> None:
    """A framework module as `sys.modules` holds it once imported (no framework is installed)."""
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_an_empty_episode_names_the_fix_of_each_framework_imported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing captured anywhere while Agno and Strands are imported: the warning gives each
    one's own fix (Agno's plain httpx client, Strands' client per request) and where it is shown;
    a framework not imported is not named."""
    _fake_framework(monkeypatch, "agno")
    _fake_framework(monkeypatch, "strands")
    monkeypatch.delitem(sys.modules, "crewai", raising=False)
    collector = tito.Collector()
    with caplog.at_level(logging.WARNING, "tito_agents"), collector.episode("e1") as ep:
        pass
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT
    assert "library='httpx'" in caplog.text and "docs/frameworks.md#agno" in caplog.text
    assert "per request" in caplog.text and "docs/frameworks.md#strands" in caplog.text
    assert "CrewAI" not in caplog.text


def _dspy_cache(memory: bool, disk: bool, lm_cache: bool = True) -> dict[str, Any]:
    """DSPy's public cache configuration, as `dspy.configure_cache` and `dspy.LM` leave it."""
    return {
        "cache": types.SimpleNamespace(enable_memory_cache=memory, enable_disk_cache=disk),
        "settings": types.SimpleNamespace(lm=types.SimpleNamespace(cache=lm_cache)),
    }


def test_a_response_cache_is_named_when_a_groups_repeated_prompts_end_empty(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DSPy's cache on and capture working: a group of identical rollouts reaches the server once
    (the first episode's call), and the others end empty; each is put down to the cache, with
    how many of the group ended empty and how to turn the cache off."""
    _fake_framework(monkeypatch, "dspy", **_dspy_cache(memory=True, disk=False))
    replay = Replay([load_capture("chat_ns")])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with caplog.at_level(logging.WARNING, "tito_agents"):
        with collector.episode("g0", group_id="g"):
            run_sync(client, load_capture("chat_ns"))
        episodes = [collector.episode(f"g{i}", group_id="g") for i in (1, 2, 3)]
        for episode in episodes:  # the cache answered: no request
            with episode:
                pass
    assert [e.report.empty_cause for e in episodes] == [EmptyEpisodeCause.RESPONSE_CACHE] * 3
    assert collector.stats.empty_episode_causes == {EmptyEpisodeCause.RESPONSE_CACHE: 3}
    assert "DSPy's response cache is on" in caplog.text
    assert "(3 episodes of group 'g' ended empty)" in caplog.text
    assert "dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)" in caplog.text


@pytest.mark.parametrize(
    "config",
    [_dspy_cache(memory=False, disk=False), _dspy_cache(memory=True, disk=True, lm_cache=False)],
    ids=["cache-off", "lm-opts-out"],
)
def test_a_response_cache_that_is_off_is_not_blamed(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]
) -> None:
    _fake_framework(monkeypatch, "dspy", **config)
    replay = Replay([load_capture("chat_ns")])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    run_sync(client, load_capture("chat_ns"))
    with collector.episode() as ep:
        pass
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT


def test_a_cache_is_not_blamed_when_nothing_was_ever_captured(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DSPy's cache on, but no request of this collector was ever captured: its client is the
    cause (DSPy's default engine talks raw sockets), named with DSPy's fix."""
    _fake_framework(monkeypatch, "dspy", **_dspy_cache(memory=True, disk=True))
    collector = tito.Collector()
    with caplog.at_level(logging.WARNING, "tito_agents"), collector.episode() as ep:
        pass
    assert ep.report.empty_cause is EmptyEpisodeCause.NO_CAPTURING_CLIENT
    assert "engine='litellm'" in caplog.text


def test_model_calls_an_integration_saw_without_a_captured_request_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An integration notes each model call its framework completed: calls beyond the captured
    requests went around capture. In an episode with other calls they are counted and logged;
    in an episode with none, that is its cause."""
    replay = Replay([load_capture("chat_ns")] * 3)
    wrapped, _ = replay_clients(replay)
    bypassing, _ = replay_clients(replay)  # a client the framework built itself
    collector = tito.Collector()
    collector.wrap(wrapped)
    with caplog.at_level(logging.WARNING, "tito_agents"):
        with collector.episode("some") as some:
            for client in (wrapped, bypassing):
                run_sync(client, load_capture("chat_ns"))
                some.note_model_call("PydanticAI")
        with collector.episode("none") as none:
            run_sync(bypassing, load_capture("chat_ns"))
            none.note_model_call("PydanticAI")
    assert len(some.calls) == 1 and some.report.bypassed_calls == 1
    assert some.report.empty_cause is None
    assert "'some': 1 of the 2 model calls PydanticAI made" in caplog.text
    assert none.report.empty_cause is EmptyEpisodeCause.BYPASSED_CAPTURE
    assert none.report.bypassed_calls == 1
    assert collector.stats.bypassed_calls == 2
    assert "docs/frameworks.md#pydanticai" in caplog.text


def test_a_retried_request_is_no_bypass() -> None:
    """A model call whose request went out twice (a retry) has captured requests enough: no
    bypass is counted."""
    replay = Replay([load_capture("chat_ns")] * 2)
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        run_sync(client, load_capture("chat_ns"))
        run_sync(client, load_capture("chat_ns"))
        ep.note_model_call("PydanticAI")
    assert ep.report.bypassed_calls == 0 and collector.stats.bypassed_calls == 0
