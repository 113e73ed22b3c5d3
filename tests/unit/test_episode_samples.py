"""`Episode.samples`: an ended episode's samples in process, whatever the sink, in every way an
episode can end (clean, capture errors, a raising body, a refusing sink, failed assembly)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

import tito_agents as tito
from tito_agents.errors import EpisodeCaptureError, EpisodeNotEndedError
from tito_agents.samples import Sample
from tito_agents.sinks import CallbackSink, read_samples
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def _client(collector: tito.Collector, fake: FakeVLLM, *, asynchronous: bool = False) -> Any:
    if asynchronous:
        http: Any = openai.DefaultAsyncHttpxClient(transport=mock_transport(fake))
        return collector.wrap(
            openai.AsyncOpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
        )
    http = openai.DefaultHttpxClient(transport=mock_transport(fake))
    return collector.wrap(
        openai.OpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
    )


def _two_turns(client: Any) -> None:
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16)
    follow = [
        *QUESTION,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    client.chat.completions.create(model=MODEL, messages=follow, max_tokens=16)


def test_samples_are_what_the_sink_got_in_order() -> None:
    """After the exit, `ep.samples` holds exactly the samples handed to the sink, in order."""
    collector = tito.Collector()
    client = _client(collector, FakeVLLM(FakeConfig()))
    with collector.episode(task_id="t") as ep:
        _two_turns(client)
        ep.set_reward(1.0)
    assert len(ep.samples) == 2 and ep.samples == captured_samples(collector)
    assert all(s.episode_id == ep.episode_id and s.reward == 1.0 for s in ep.samples)
    assert [s.call_ids[0] for s in ep.samples] == [c.call_id for c in ep.calls]
    collector.close()


def test_samples_with_a_file_sink_equal_the_file(tmp_path: Path) -> None:
    """With the default file sink (a path), the samples are kept in process too, equal to what
    the file holds once the collector is closed."""
    path = tmp_path / "samples.jsonl"
    collector = tito.Collector(path, capture_logprobs=True)
    client = _client(collector, FakeVLLM(FakeConfig()))
    with collector.episode() as ep:
        _two_turns(client)
    collector.close()
    written = list(read_samples(path))
    assert [s.to_dict().keys() for s in written] == [s.to_dict().keys() for s in ep.samples]
    assert [s.sample_id for s in written] == [s.sample_id for s in ep.samples]
    for mine, stored in zip(ep.samples, written, strict=True):
        assert mine.token_ids.tolist() == stored.token_ids.tolist()
        assert mine.loss_mask.tolist() == stored.loss_mask.tolist()


def test_both_views_per_call_first_and_labelled() -> None:
    """With assembly="both": per-call samples, then the merged one, each saying its view."""
    collector = tito.Collector(assembly="both")
    client = _client(collector, FakeVLLM(FakeConfig()))
    with collector.episode() as ep:
        _two_turns(client)
    assert [s.view for s in ep.samples] == ["per_call", "per_call", "merged"]
    merged = ep.samples[-1]
    assert merged.call_ids == [s.call_ids[0] for s in ep.samples[:2]]
    collector.close()


def test_before_the_end_samples_raise() -> None:
    """Inside the block the samples do not exist yet: a typed error says when they will."""
    collector = tito.Collector()
    with (
        collector.episode("ep-open") as ep,
        pytest.raises(EpisodeNotEndedError, match="has not ended"),
    ):
        _ = ep.samples
    assert ep.samples == []  # ended with no call: no samples
    collector.close()


def test_a_body_that_raised_has_no_samples() -> None:
    """A crashed rollout writes nothing, and its `samples` is empty (its calls stay readable)."""
    collector = tito.Collector()
    client = _client(collector, FakeVLLM(FakeConfig()))
    with pytest.raises(KeyError), collector.episode() as ep:
        _two_turns(client)
        raise KeyError("the agent crashed")
    assert ep.samples == [] and len(ep.calls) == 2
    assert captured_samples(collector) == []
    collector.close()


def test_capture_errors_keep_the_good_calls_samples() -> None:
    """Some calls not captured exactly: the exit raises, and `samples` holds the good calls'."""
    collector = tito.Collector()
    client = _client(collector, FakeVLLM(FakeConfig()))
    with pytest.raises(EpisodeCaptureError), collector.episode() as ep:
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8)
        client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=8,
            extra_headers={"x-fake-fault": "no_token_ids"},
        )
    assert len(ep.calls) == 2 and len(ep.samples) == 1
    assert ep.samples == captured_samples(collector)
    collector.close()


def test_a_refusing_sink_still_leaves_the_samples_in_process() -> None:
    """A sink failure is counted, and the assembled samples are still on the episode."""

    def refuse(samples: Sequence[Sample]) -> None:
        raise OSError("disk full")

    collector = tito.Collector(CallbackSink(refuse))
    client = _client(collector, FakeVLLM(FakeConfig()))
    with collector.episode() as ep:
        _two_turns(client)
    assert len(ep.samples) == 2
    assert collector.stats.lost_samples == 2
    collector.close()


def test_failed_assembly_says_so() -> None:
    """When assembling fails (here: an invalid turn discount), the exit raises that error and
    `samples` says the episode ended without samples."""
    collector = tito.Collector(assembly="merged")
    collector.settings.turn_discount = 2.0  # refused when merged samples are made
    client = _client(collector, FakeVLLM(FakeConfig()))
    with pytest.raises(ValueError, match="turn_discount"), collector.episode() as ep:
        _two_turns(client)
    with pytest.raises(EpisodeNotEndedError, match="assembling them failed"):
        _ = ep.samples
    collector.close()


def test_async_with_sets_samples_too() -> None:
    """`async with` ends the episode through the async path; the samples are set the same way."""

    async def main() -> list[Sample]:
        collector = tito.Collector()
        client = _client(collector, FakeVLLM(FakeConfig()), asynchronous=True)
        async with collector.episode() as ep:
            await client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8)
        await collector.aclose()
        return ep.samples

    samples = asyncio.run(main())
    assert len(samples) == 1 and samples[0].view == "per_call"
