"""`TitoRolloutWorker` (AsyncGRPO's `rollout_worker=`) against the fake vLLM over HTTP, with TRL
1.16's real `RolloutSample` and the real dataset its trainer drains the queue through.

Every test waits on the worker's queue or its end (`wait_done`), never on time."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest

from tests.support.trl_async_fake import (
    TIMEOUT_S,
    Gate,
    RecordingModel,
    ask,
    completion_ids,
    drain,
    length_agent,
    make_worker,
    take,
)
from tito_agents.rl.trl_async import TitoRolloutWorker, group_advantages
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample


@pytest.fixture(scope="module")
def model() -> RecordingModel:
    return RecordingModel()


@pytest.fixture(scope="module")
def server(model: RecordingModel) -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=model)) as srv:
        yield srv


@pytest.fixture
def started() -> Iterator[list[TitoRolloutWorker]]:
    """Workers a test started, stopped at its end whatever happened."""
    workers: list[TitoRolloutWorker] = []
    yield workers
    for worker in workers:
        worker.stop()


def run(server: FakeVLLMServer, started: list[Any], agent: Any, rows: list[str], **kw: Any) -> Any:
    worker = make_worker(server.base_url, agent, [{"prompt": p} for p in rows], **kw)
    started.append(worker)
    worker.start()
    return worker


def test_rows_carry_the_ids_the_fake_sampled(
    server: FakeVLLMServer, model: RecordingModel, started: list[Any]
) -> None:
    """Two rows x two generations: four `RolloutSample`s whose completion tokens are exactly the
    ids the server said, with a logprob per token, a group id per row and TRL's advantages."""
    before = len(model.said)
    worker = run(server, started, length_agent, ["p0", "p1"], epochs=1)
    samples = drain(worker)
    assert len(samples) == 4 and all(isinstance(s, RolloutSample) for s in samples)
    said = model.said[before:]
    assert Counter(tuple(completion_ids(s)) for s in samples) == Counter(map(tuple, said))
    for s in samples:
        assert len(s.old_log_probs) == len(s.input_ids) == len(s.completion_mask)
        assert s.input_ids.dtype == np.int64 and s.old_log_probs.dtype == np.float32
        assert s.completion_mask[0] == 0  # the prompt is not trained on
        assert np.all(s.old_log_probs[s.completion_mask == 1] < 0)
        assert s.model_version == 0 and s.enqueued_at is not None
    groups = defaultdict(list)
    for s in samples:
        groups[s.group_id].append(s)
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    for group in groups.values():
        rewards = np.array([s.metrics["reward"] for s in group])
        assert [s.advantage for s in group] == pytest.approx(group_advantages(rewards).tolist())
    assert worker.stats.groups == 2 and worker.stats.samples == 4
    assert worker.stats.skipped_episodes == 0
    metrics = worker.metrics_queue.get_nowait()
    assert metrics["tito/skipped_episodes"] == 0.0


def test_each_sample_carries_the_version_that_sampled_it(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    """An episode whose second call goes out after `update_model_version(3)` is labelled with the
    oldest weights that sampled it (0); the next row, all sampled by 3, with 3; the collector's
    label follows the trainer's version."""
    gate = Gate()
    worker = run(
        server, started, gate, ["first", "second"], num_generations=1, epochs=1, sessions=True
    )
    assert gate.waiting.wait(TIMEOUT_S)
    worker.update_model_version(3)
    assert worker.collector.settings.policy_version == "3"
    gate.open()
    first, second = take(worker, 2)
    assert (first.model_version, second.model_version) == (0, 3)
    assert worker.wait_done(TIMEOUT_S) and worker.stats.linked_rows == 0


def test_trls_queue_dataset_drains_the_worker_and_drops_stale_rows(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    """TRL's own `RolloutQueueDataset` (what `AsyncGRPOTrainer.get_train_dataloader` builds over
    `rollout_buffer` and `check_health`) yields our rows, and drops them once the trainer's
    version is past `max_staleness`."""
    from accelerate import PartialState

    PartialState(cpu=True)  # the trainer's Accelerator does this; TRL's logger needs it
    worker = run(server, started, length_agent, ["p0", "p1"], epochs=1)
    assert worker.wait_done(TIMEOUT_S)
    version = {"now": 0}
    metrics: dict[str, list[float]] = defaultdict(list)
    dataset = RolloutQueueDataset(
        rollout_queue=worker.rollout_buffer,
        model_version_fn=lambda: version["now"],
        check_health_fn=lambda s: None,
        stale_after_s=TIMEOUT_S,
        metrics=metrics,
        max_staleness=1,
        poll_interval_s=TIMEOUT_S,
    )
    rows = iter(dataset)
    first = next(rows)
    assert set(first) >= {"input_ids", "completion_mask", "old_log_probs", "advantage"}
    version["now"] = 2  # the remaining three rows, sampled by 0, are two versions old
    worker.rollout_buffer.put(fresh(first))
    kept = next(rows)
    assert kept["group_id"] == -1  # the fresh row, after three stale ones
    assert metrics["sample/dropped_stale_total"] == [1.0, 1.0, 1.0]


def fresh(row: dict[str, Any]) -> RolloutSample:
    """A row sampled by version 2, marked by its group id."""
    return RolloutSample(
        prompt=[],
        completion=[],
        input_ids=row["input_ids"],
        completion_mask=row["completion_mask"],
        old_log_probs=row["old_log_probs"],
        advantage=0.0,
        model_version=2,
        group_id=-1,
        metrics={},
    )


def test_an_agent_that_raises_is_skipped_and_counted(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        if prompt == "bad":
            raise RuntimeError("tool crashed")
        return await length_agent(prompt, client)

    worker = run(server, started, agent, ["bad", "good"], epochs=1)
    samples = drain(worker)
    assert len(samples) == 2
    stats = worker.stats
    assert (stats.skipped_episodes, stats.skipped_groups, stats.groups) == (2, 1, 1)
    assert stats.last_skip is not None and "tool crashed" in stats.last_skip
    with pytest.raises(RuntimeError, match="has no more rollouts"):
        worker.check_health(TIMEOUT_S)


def test_an_episode_without_a_captured_call_is_skipped_with_the_fix(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    calls = {"n": 0}

    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        calls["n"] += 1
        if calls["n"] % 2:  # one generation of each group makes no call
            return 1.0
        return await length_agent(prompt, client)

    worker = run(server, started, agent, ["p0"], epochs=1)
    (sample,) = drain(worker)
    assert sample.advantage == 0.0  # alone in its group
    assert worker.stats.skipped_episodes == 1
    assert "no sample" in str(worker.stats.last_skip)
    assert "collector.wrap" in str(worker.stats.last_skip)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "high", None])
def test_a_reward_that_is_not_a_finite_number_gives_advantage_zero(
    server: FakeVLLMServer, started: list[Any], bad: Any
) -> None:
    """Its row stays (advantage 0, reward NaN, counted); the others are normalised without it."""
    calls = {"n": 0}

    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> Any:
        calls["n"] += 1
        reward = [bad, 1.0, 3.0][(calls["n"] - 1) % 3]
        await ask(prompt, client)
        return reward

    worker = run(server, started, agent, ["p0"], num_generations=3, epochs=1)
    samples = drain(worker)
    by_reward = {
        ("nan" if math.isnan(s.metrics["reward"]) else s.metrics["reward"]): s.advantage
        for s in samples
    }
    assert by_reward == {"nan": 0.0, 1.0: pytest.approx(-1.0), 3.0: pytest.approx(1.0)}
    assert worker.stats.unscored_episodes == 1


def test_all_equal_rewards_give_advantage_zero(server: FakeVLLMServer, started: list[Any]) -> None:
    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        await ask(prompt, client)
        return 0.5

    worker = run(server, started, agent, ["p0"], num_generations=4, epochs=1)
    assert [s.advantage for s in drain(worker)] == [0.0] * 4


def test_the_reward_function_overrides_and_a_raising_one_skips(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    def reward_func(row: Any, episode: Any) -> float:
        if row["prompt"] == "bad":
            raise ValueError("no gold answer")
        return 2.0 if episode.samples else 0.0

    worker = run(server, started, length_agent, ["bad", "good"], epochs=1, reward_func=reward_func)
    samples = drain(worker)
    assert [s.metrics["reward"] for s in samples] == [2.0, 2.0]
    assert worker.stats.skipped_episodes == 2
    assert "no gold answer" in str(worker.stats.last_skip)


async def two_conversations(prompt: Any, client: openai.AsyncOpenAI) -> float:
    """Two unrelated chats in one episode: two merged samples (linked segments)."""
    await ask(f"{prompt} A", client)
    await ask(f"{prompt} B", client)
    return 1.0


def test_linked_segments_become_rows_sharing_the_episode_advantage(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    calls = {"n": 0}

    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        calls["n"] += 1
        reward = float(calls["n"])  # generation rewards 1 and 2
        await two_conversations(prompt, client)
        return reward

    worker = run(server, started, agent, ["p0"], epochs=1)
    samples = drain(worker)
    assert len(samples) == 4 and worker.stats.linked_rows == 2
    advantages = Counter(round(s.advantage, 6) for s in samples)
    assert advantages == {-1.0: 2, 1.0: 2}  # each episode's one advantage on both its rows
    assert len({s.group_id for s in samples}) == 1


def test_linked_segments_can_be_refused_with_the_reason(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    worker = run(server, started, two_conversations, ["p0"], epochs=1, linked="refuse")
    assert drain(worker) == []
    assert worker.stats.skipped_episodes == 2 and worker.stats.skipped_groups == 1
    assert "merged samples where TRL takes one" in str(worker.stats.last_skip)


def test_a_worker_that_produces_nothing_fails_its_health_check(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    """Every episode failing: nothing is put, the heartbeat stops, and `check_health` (what the
    trainer calls while its queue is empty) raises with the counts and the last failure."""
    failed = threading.Event()
    calls = {"n": 0}

    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        calls["n"] += 1
        if calls["n"] >= 4:
            failed.set()
        raise ConnectionError("sandbox unreachable")

    worker = run(server, started, agent, ["p0"])  # epochs=None: it keeps trying
    assert failed.wait(TIMEOUT_S)
    worker.check_health(TIMEOUT_S * 100)  # not stale yet on the trainer's clock
    with pytest.raises(RuntimeError, match="sandbox unreachable"):
        worker.check_health(0.0)
    worker.stop()
    assert worker.wait_done(TIMEOUT_S) and worker.rollout_buffer.empty()


def test_stop_ends_an_endless_worker(server: FakeVLLMServer, started: list[Any]) -> None:
    worker = run(server, started, length_agent, ["p0"], queue_maxsize=2)
    take(worker, 2)
    worker.stop()
    assert worker.wait_done(TIMEOUT_S)
    worker.check_health(TIMEOUT_S)  # a stopped worker is not "out of data"


def test_an_error_of_the_worker_itself_is_raised_by_check_health(
    server: FakeVLLMServer, started: list[Any]
) -> None:
    """A dataset row without the prompt field is no episode's fault: the run ends and the
    trainer's next `check_health` raises it (in the trainer's thread, with the cause)."""
    worker = make_worker(server.base_url, length_agent, [{"question": "p0"}], num_generations=2)
    started.append(worker)
    worker.start()
    assert worker.wait_done(TIMEOUT_S)
    with pytest.raises(RuntimeError, match="worker failed: KeyError") as raised:
        worker.check_health(TIMEOUT_S)
    assert isinstance(raised.value.__cause__, KeyError)


def test_stop_cancels_episodes_in_flight(server: FakeVLLMServer, started: list[Any]) -> None:
    """An agent stuck mid-episode (the trainer ends while it waits on a tool) does not hold up
    `stop`: its episode is cancelled and nothing half-done is queued."""
    stuck = threading.Event()

    async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
        await ask(prompt, client)
        stuck.set()
        await asyncio.Event().wait()  # a tool that never answers
        return 1.0

    worker = run(server, started, agent, ["p0"])
    assert stuck.wait(TIMEOUT_S)
    worker.stop()
    assert worker.wait_done(TIMEOUT_S)
    assert worker.rollout_buffer.empty() and worker.stats.skipped_episodes == 0
