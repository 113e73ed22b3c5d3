"""Episodes: every captured call belongs to the episode, agent and labels current when its
request was sent (contextvars), across threads with `bind` / `ContextThreadPoolExecutor`, across
concurrent asyncio episodes, and through the resolvers framework adapters register; calls outside
any episode follow the collector's policy; a failed episode writes nothing; rewards are finite."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import tito_agents as tito
from tests.support.capture_replay import Replay, load_capture, replay_clients, run_async, run_sync
from tito_agents import integration
from tito_agents.episodes import current_labels, resolve_attribution
from tito_agents.testing import captured_samples


def test_scopes_nest_and_restore() -> None:
    """The innermost episode and agent win and labels merge over the enclosing ones; leaving a
    block restores exactly what was there before."""
    collector = tito.Collector()
    outer, inner = collector.episode("outer"), collector.episode("inner")
    assert tito.current_episode() is None
    with outer, tito.agent("solver"), tito.labels(run=1, node="a"):
        with inner, tito.agent("critic"), tito.labels(node="b"):
            assert tito.current_episode() is inner
            assert integration.current_agent() == "critic"
            assert dict(current_labels()) == {"run": 1, "node": "b"}
        assert tito.current_episode() is outer
        assert integration.current_agent() == "solver"
        assert dict(current_labels()) == {"run": 1, "node": "a"}
    assert (tito.current_episode(), integration.current_agent(), dict(current_labels())) == (
        None,
        None,
        {},
    )


def test_a_resolver_registered_twice_runs_once() -> None:
    """register_resolver is idempotent, and an unregistered resolver is no longer asked."""
    asked: list[int] = []

    def resolver() -> integration.Attribution:
        asked.append(1)
        return integration.Attribution(agent="from-resolver", labels={"k": 1})

    integration.register_resolver(resolver)
    integration.register_resolver(resolver)
    try:
        _, agent, labels = resolve_attribution()
    finally:
        integration.unregister_resolver(resolver)
    assert (agent, dict(labels), len(asked)) == ("from-resolver", {"k": 1}, 1)
    integration.unregister_resolver(resolver)  # not registered: no error
    assert resolve_attribution()[1] is None and len(asked) == 1


def test_bind_snapshots_the_context_when_it_is_called() -> None:
    """`bind(fn)` carries the context of the moment it wraps `fn`, not of the moment it runs."""
    seen: list[Any] = []

    def record() -> None:
        seen.append((integration.current_agent(), dict(current_labels())))

    with tito.agent("planner"), tito.labels(step=1):
        bound = tito.bind(record)
    with tito.agent("other"):
        thread = threading.Thread(target=bound)
        thread.start()
        thread.join()
    assert seen == [("planner", {"step": 1})]


def test_threads_keep_the_episode_with_bind() -> None:
    """A raw thread pool loses the episode; bind() and ContextThreadPoolExecutor carry it."""
    from concurrent.futures import ThreadPoolExecutor

    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False, outside_episode="ignore")
    collector.wrap(client)

    def call() -> None:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])

    with collector.episode() as ep, ThreadPoolExecutor(1) as raw_pool:
        raw_pool.submit(call).result()
        assert ep.calls == []
        raw_pool.submit(tito.bind(call)).result()
        assert len(ep.calls) == 1
    with collector.episode() as ep2, integration.ContextThreadPoolExecutor(1) as pool:
        pool.submit(call).result()
    assert len(ep2.calls) == 1


def test_agent_and_labels_are_snapshotted_at_request_time() -> None:
    """Calls carry the agent and labels that were current when the request was sent."""
    cap, other = load_capture("chat_ns"), load_capture("eos")
    client, _ = replay_clients(Replay([cap, other]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode(agent="solver") as ep:
        with tito.agent("planner"), tito.labels(node="plan", step=1):
            run_sync(client, cap)
        run_sync(client, other)
    call, later = ep.calls
    assert later.agent == "solver" and later.labels == {}
    assert call.agent == "planner"
    assert call.labels == {"node": "plan", "step": 1}
    assert captured_samples(collector)[0].agent == "planner"


def test_concurrent_async_episodes_do_not_mix() -> None:
    """Concurrent asyncio episodes each get exactly their own call."""

    async def main() -> None:
        collector = tito.Collector(capture_logprobs=False)
        caps = [load_capture("chat_ns"), load_capture("eos")]
        clients = []
        for cap in caps:
            _, client = replay_clients(Replay([cap]))
            collector.wrap(client)
            clients.append(client)

        async def rollout(i: int) -> tito.Episode:
            async with collector.episode(f"ep{i}") as ep:
                await asyncio.sleep(0.001 * (i % 3))
                await run_async(clients[i % 2], caps[i % 2])
            return ep

        eps = await asyncio.gather(*(rollout(i) for i in range(50)))
        for i, ep in enumerate(eps):
            assert len(ep.calls) == 1
            assert ep.calls[0].episode_id == f"ep{i}"
            assert ep.calls[0].request_id == caps[i % 2].json()["id"]

    asyncio.run(main())


def test_resolvers_attribute_calls_and_explicit_scopes_win() -> None:
    """A registered resolver supplies episode, agent and labels; explicit scopes take precedence;
    a failing resolver never breaks the call."""
    cap, other = load_capture("chat_ns"), load_capture("eos")
    client, _ = replay_clients(Replay([cap, other]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    framework_episode = collector.episode("from-framework")

    def resolver() -> integration.Attribution:
        return integration.Attribution(framework_episode, "node-a", {"langgraph_step": 3, "x": 1})

    def broken() -> integration.Attribution:
        raise RuntimeError("resolver bug")

    integration.register_resolver(broken)
    integration.register_resolver(resolver)
    try:
        run_sync(client, cap)  # no explicit scope: the resolver's episode (never entered) gets it
        with collector.episode("explicit") as ep, tito.agent("planner"), tito.labels(x=2):
            run_sync(client, other)
    finally:
        integration.unregister_resolver(resolver)
        integration.unregister_resolver(broken)
    (framework_call,) = framework_episode.calls
    assert framework_call.agent == "node-a"
    assert framework_call.labels == {"langgraph_step": 3, "x": 1}
    (explicit_call,) = ep.calls
    assert explicit_call.agent == "planner"
    assert explicit_call.labels == {"langgraph_step": 3, "x": 2}


def _collect(cap: Any) -> tuple[tito.Collector, Any]:
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    return collector, client


def test_calls_outside_an_episode_default_to_immediate_samples() -> None:
    """Default: a call outside any episode becomes a per-call sample of episode "default",
    assembled and written by the processor's thread (off the request path); `flush` waits for it."""
    collector, client = _collect(load_capture("chat_ns"))
    run_sync(client, load_capture("chat_ns"))
    assert collector.default_episode.calls == []  # memory stays bounded
    collector.flush()
    samples = captured_samples(collector)
    assert [s.episode_id for s in samples] == ["default"]
    assert collector.stats.samples == 1


def test_calls_outside_an_episode_can_be_refused() -> None:
    """outside_episode='error' refuses the request before it is sent."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    tito.Collector(outside_episode="error").wrap(client)
    with pytest.raises(tito.errors.OutsideEpisodeError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert replay.received == []


def test_failed_episode_writes_no_samples() -> None:
    """An episode whose body raised writes nothing (its reward cannot be trusted) and is counted."""
    collector, client = _collect(load_capture("chat_ns"))
    with pytest.raises(RuntimeError), collector.episode() as ep:
        run_sync(client, load_capture("chat_ns"))
        raise RuntimeError("agent crashed")
    assert len(ep.calls) == 1
    assert captured_samples(collector) == []
    assert collector.stats.failed_episodes == 1


def test_rewards_must_be_finite() -> None:
    """NaN or infinite rewards are refused when set, not trained on later."""
    collector, _ = _collect(load_capture("chat_ns"))
    with collector.episode() as ep:
        with pytest.raises(ValueError, match="finite"):
            ep.set_reward(float("nan"))
        ep.set_reward(0.5)
    assert ep.reward == 0.5
