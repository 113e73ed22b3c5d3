"""Episode lifecycle edges: an `Episode` is one rollout, entered once and ended once. Entering it
again (nested or after its end), ending it twice, or rewarding it after its end raises
`EpisodeStateError` instead of writing its samples twice, counting it twice, leaking it as the
current episode or dropping the reward; an exit in another context than the entering one (an
async generator closed in a task of its own, `__exit__` from another thread) still ends it."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import AsyncGenerator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

import tito_agents as tito
from tito_agents.config import EmptyEpisodeCause
from tito_agents.errors import EpisodeStateError, TitoError
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=lambda view: "Hello there."))


def _client(collector: tito.Collector) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(transport=mock_transport(_fake()))
    return collector.wrap(
        openai.OpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
    )


def _async_client(collector: tito.Collector) -> openai.AsyncOpenAI:
    http = openai.DefaultAsyncHttpxClient(transport=mock_transport(_fake()))
    return collector.wrap(
        openai.AsyncOpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
    )


def test_an_episode_entered_inside_itself_is_refused_and_does_not_leak() -> None:
    """`with ep: with ep:` is refused: the inner block would overwrite the scope's token, its exit
    write the samples, the outer write them again, and the episode stay current after both."""
    with tito.Collector() as collector:
        client = _client(collector)
        ep = collector.episode("twice")
        with pytest.raises(EpisodeStateError, match="is already entered"), ep:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
            with ep:
                pass
        assert tito.current_episode() is None
        assert (collector.stats.episodes, collector.stats.failed_episodes) == (1, 1)
        assert captured_samples(collector) == [] and len(ep.calls) == 1


def test_an_episode_entered_again_after_its_end_is_refused() -> None:
    """Re-entering an ended episode is refused: it would write its first samples a second time and
    drop the new block's calls as late calls."""
    with tito.Collector() as collector:
        client = _client(collector)
        ep = collector.episode("again")
        with ep:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        with pytest.raises(EpisodeStateError, match="after its end"), ep:
            pytest.fail("the body of a refused re-entry must not run")
        assert tito.current_episode() is None
        assert len(captured_samples(collector)) == 1 and collector.stats.episodes == 1


def test_ending_an_episode_twice_is_refused_and_writes_once() -> None:
    """`end()` after the `with` exit (or twice by an adapter) is refused: nothing is written twice."""
    with tito.Collector() as collector:
        client = _client(collector)
        with collector.episode("e") as ep:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        with pytest.raises(EpisodeStateError) as caught:
            ep.end()
        assert isinstance(caught.value, TitoError) and isinstance(caught.value, RuntimeError)
        with pytest.raises(EpisodeStateError):
            asyncio.run(ep.aend())
        assert len(captured_samples(collector)) == 1 and collector.stats.episodes == 1


def test_a_body_that_ends_its_episode_then_raises_keeps_its_own_exception() -> None:
    """An episode ended inside its block whose body then raises: the body's exception goes on
    unchanged, and the exit does not end (count, write) the episode again."""
    with tito.Collector() as collector:
        client = _client(collector)
        with pytest.raises(KeyError, match="the agent's"), collector.episode("e") as ep:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
            ep.end()
            raise KeyError("the agent's")
        assert len(ep.samples) == 1 and len(captured_samples(collector)) == 1
        assert (collector.stats.episodes, collector.stats.failed_episodes) == (1, 0)


def test_a_body_that_ends_its_episode_exits_quietly_and_writes_once() -> None:
    """`end()` inside the block (as an adapter whose framework reports the end may call it), then
    a normal exit: the episode is written once and the exit raises nothing."""
    with tito.Collector() as collector:
        client = _client(collector)
        with collector.episode("e") as ep:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
            ep.end()

        async def main() -> None:
            async with collector.episode("a") as aep:
                await asyncio.sleep(0)
                await aep.aend()

        asyncio.run(main())
        assert len(captured_samples(collector)) == 1 and collector.stats.episodes == 2


def test_rewards_set_after_the_end_are_refused() -> None:
    """A reward set after the exit reaches no sample (they were made at the exit), so it is refused
    rather than kept silently on the episode while the samples have no reward."""
    with tito.Collector() as collector:
        client = _client(collector)
        with collector.episode("e") as ep:
            response = client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        with pytest.raises(EpisodeStateError, match="set_reward"):
            ep.set_reward(1.0)
        with pytest.raises(EpisodeStateError, match="set_call_reward"):
            ep.set_call_reward(response, 1.0)
        assert ep.reward is None and ep.calls[0].reward is None
        assert [s.reward for s in ep.samples] == [None]


def test_an_async_generator_closed_in_another_task_still_ends_its_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A generator agent yielding inside its episode, closed by a task of its own (as the event
    loop's finaliser closes one the consumer left early): the exit runs in another context, where
    resetting the contextvar raises ValueError; the episode still ends and is counted."""

    async def main() -> tito.Episode:
        collector = tito.Collector()
        client = _async_client(collector)
        opened: list[tito.Episode] = []

        async def agent() -> AsyncGenerator[str, None]:
            async with collector.episode("gen") as ep:
                opened.append(ep)
                for _ in range(3):
                    response = await client.chat.completions.create(
                        model=MODEL_NAME, messages=MSG, max_tokens=4
                    )
                    yield response.choices[0].message.content or ""

        stream = agent()
        async for _ in stream:
            break  # the consumer leaves early
        await asyncio.create_task(stream.aclose())  # closed in another task's context
        assert (collector.stats.episodes, collector.stats.failed_episodes) == (1, 1)
        await client.close()
        collector.close()
        return opened[0]

    with caplog.at_level(logging.WARNING, "tito_agents"):
        ep = contextvars.copy_context().run(asyncio.run, main())
    assert ep.closed and len(ep.calls) == 1 and ep.samples == []
    assert "exited in another context" in caplog.text


def test_an_episode_exited_from_another_thread_still_ends() -> None:
    """`__exit__` called from a thread other than the entering one (where resetting the contextvar
    raises ValueError) still ends the episode and writes its samples."""

    def run() -> tuple[tito.Collector, tito.Episode, list[BaseException]]:
        collector = tito.Collector()
        client = _client(collector)
        ep = collector.episode("x")
        ep.__enter__()
        client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        errors: list[BaseException] = []

        def exit_there() -> None:
            try:
                ep.__exit__(None, None, None)
            except BaseException as exc:  # the assertion below names it
                errors.append(exc)

        thread = threading.Thread(target=exit_there)
        thread.start()
        thread.join()
        collector.close()
        return collector, ep, errors

    collector, ep, errors = contextvars.copy_context().run(run)  # the leaked scope stays there
    assert errors == []
    assert ep.closed and len(ep.samples) == 1 and len(captured_samples(collector)) == 1


def test_an_episode_left_with_its_stream_open_says_so_not_to_wrap_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A consumer that breaks out of a stream without closing it, then leaves the episode: the
    call is still in flight at the end. The warning names that call; it does not say that no
    request went through a capturing client or to wrap it, which would be wrong (one did)."""
    with tito.Collector() as collector:
        client = _client(collector)
        with caplog.at_level(logging.WARNING, "tito_agents"), collector.episode("left") as ep:
            stream = client.chat.completions.create(
                model=MODEL_NAME, messages=MSG, max_tokens=4, stream=True
            )
            for _ in stream:
                break
        stream.close()
        assert ep.report.in_flight == 1 and ep.calls == [] and collector.stats.empty_episodes == 1
        assert "'left' ended with no captured call while 1 of its calls" in caplog.text
        assert "collector.wrap(client)" not in caplog.text
        assert ep.report.empty_cause is EmptyEpisodeCause.IN_FLIGHT
        assert collector.stats.late_calls == 1
