"""Constrained calls on the fake vLLM over HTTP: every sample says how its spans were sampled, and
with re-scoring on, the policy's own logprobs are recovered from the same server.

The fake reports masked logprobs for constrained requests (`fake_vllm._logprobs.masked`), as vLLM
does, while `prompt_logprobs` re-scoring is unmasked: the two differ, so a test that compared the
wrong array would fail.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.rescore_fake import rescore_independently
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer, RequestView
from tito_agents.testing.smollm2 import MODEL_NAME

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
SECRET = "sk-secret-never-persisted"


def responder(view: RequestView) -> str:
    if view.tool_choice == "required" or isinstance(view.tool_choice, dict):
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    return "It is sunny in Paris today."


@pytest.fixture(scope="module")
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=responder)) as srv:
        yield srv


def client_for(server: FakeVLLMServer, collector: tito.Collector) -> openai.OpenAI:
    return collector.wrap(openai.OpenAI(base_url=server.base_url, api_key=SECRET, max_retries=0))


FORCED: dict[str, Any] = {
    "model": MODEL_NAME,
    "tools": TOOLS,
    "tool_choice": "required",
    "max_tokens": 60,
}


def forced_call(client: openai.OpenAI) -> None:
    """One chat call with a forced tool choice (vLLM samples it through a grammar mask)."""
    client.chat.completions.create(messages=[{"role": "user", "content": "Weather?"}], **FORCED)


def run_episode(client: openai.OpenAI, collector: tito.Collector, forced: Any) -> None:
    with collector.episode() as episode:
        episode.reward = 1.0
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
        client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=TOOLS, tool_choice=forced, max_tokens=60
        )
        client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=20)


@pytest.mark.parametrize(
    "forced", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_constrained_spans_are_flagged_and_rescored(server: FakeVLLMServer, forced: Any) -> None:
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True)
    run_episode(client_for(server, collector), collector, forced)
    forced_sample, free_sample = captured_samples(collector)
    kind = "tool_choice=required" if forced == "required" else "tool_choice=named"

    (span,) = forced_sample.spans
    assert (span.constrained, span.logprob_source, span.rescore_error) == (kind, "rescored", None)
    assert forced_sample.policy_logprobs is not None and forced_sample.logprobs is not None
    trained = forced_sample.loss_mask == 1
    policy = rescore_independently(server, forced_sample)
    np.testing.assert_allclose(forced_sample.policy_logprobs[trained], policy[trained], atol=1e-6)
    # the rollout logprobs stay what the engine reported: the masked ones, far from the policy's
    assert np.abs(forced_sample.logprobs[trained] - policy[trained]).mean() > 0.5
    assert forced_sample.constrained_mask().tolist() == forced_sample.loss_mask.tolist()
    assert forced_sample.ratio_logprobs() is forced_sample.policy_logprobs

    (free,) = free_sample.spans
    assert (free.constrained, free.logprob_source) == (None, "policy")
    assert free_sample.policy_logprobs is None  # nothing re-scored: `logprobs` are the policy's
    assert not free_sample.constrained_mask().any()
    stats = collector.stats
    assert (stats.constrained_calls, stats.rescored_calls, stats.rescore_failures) == (1, 1, 0)


def test_without_rescoring_the_masked_span_says_so(server: FakeVLLMServer) -> None:
    collector = tito.Collector(capture_logprobs=True)
    run_episode(client_for(server, collector), collector, "required")
    forced_sample = captured_samples(collector)[0]
    (span,) = forced_sample.spans
    assert (span.constrained, span.logprob_source) == ("tool_choice=required", "masked")
    assert forced_sample.policy_logprobs is None
    assert collector.stats.rescored_calls == 0


def test_rescoring_sends_one_batched_request_per_episode(server: FakeVLLMServer) -> None:
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True)
    client = client_for(server, collector)
    seen: list[int] = []
    with collector.episode():
        for _ in range(3):
            forced_call(client)
        seen.append(collector.stats.rescored_calls)  # nothing re-scored during the episode
    assert seen == [0]
    assert collector.stats.rescored_calls == 3
    assert all(s.spans[0].logprob_source == "rescored" for s in captured_samples(collector))


def test_a_server_that_cannot_rescore_leaves_the_flag_and_a_reason() -> None:
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True)
    with FakeVLLMServer(FakeConfig(responder=responder)) as gone:
        client = client_for(gone, collector)
        episode = collector.episode()
        episode.__enter__()
        forced_call(client)
    episode.__exit__(None, None, None)  # the server is down when the episode ends
    (sample,) = captured_samples(collector)
    (span,) = sample.spans
    assert span.constrained == "tool_choice=required"
    assert span.logprob_source == "masked"
    assert span.rescore_error is not None and "request failed" in span.rescore_error
    assert sample.policy_logprobs is None
    assert collector.stats.rescore_failures == 1


def test_a_refused_batch_is_retried_call_by_call(server: FakeVLLMServer) -> None:
    """One call the server cannot score (here: its ids are not a valid token prompt) does not
    cost the other calls of the batch their logprobs."""
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True)
    client = client_for(server, collector)
    with collector.episode() as episode:
        for _ in range(2):
            forced_call(client)
        episode.calls[0].sampled_ids = episode.calls[0].sampled_ids.copy()
        episode.calls[0].sampled_ids[0] = 10**8  # out of the vocabulary: refused with HTTP 400
    bad, good = captured_samples(collector)
    assert bad.spans[0].logprob_source == "masked"
    assert "HTTP 400" in (bad.spans[0].rescore_error or "")
    assert good.spans[0].logprob_source == "rescored"
    assert (collector.stats.rescored_calls, collector.stats.rescore_failures) == (1, 1)


def test_async_episode_rescores_on_the_event_loop(server: FakeVLLMServer) -> None:
    collector = tito.Collector(capture_logprobs=True, rescore_constrained=True)
    client = collector.wrap(
        openai.AsyncOpenAI(base_url=server.base_url, api_key=SECRET, max_retries=0)
    )

    async def main() -> None:
        async with collector.episode():
            await asyncio.gather(
                *(
                    client.chat.completions.create(
                        messages=[{"role": "user", "content": f"Weather {i}?"}], **FORCED
                    )
                    for i in range(4)
                )
            )
        await client.close()

    asyncio.run(main())
    assert collector.stats.rescored_calls == 4
    for sample in captured_samples(collector):
        policy = rescore_independently(server, sample)
        trained = sample.loss_mask == 1
        assert sample.policy_logprobs is not None
        np.testing.assert_allclose(sample.policy_logprobs[trained], policy[trained], atol=1e-6)


def test_flags_survive_the_default_sink_and_no_credential_is_written(
    server: FakeVLLMServer, tmp_path: Path
) -> None:
    path = tmp_path / "samples.jsonl"
    collector = tito.Collector(path, capture_logprobs=True, rescore_constrained=True)
    run_episode(client_for(server, collector), collector, "required")
    collector.close()
    text = path.read_text()
    assert SECRET not in text and "authorization" not in text.lower()
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0]["spans"][0]["constrained"] == "tool_choice=required"
    assert rows[0]["spans"][0]["logprob_source"] == "rescored"
    assert rows[0]["policy_logprobs"] is not None and rows[1]["policy_logprobs"] is None
    back = tito.Sample.from_dict(rows[0])
    assert back.policy_logprobs is not None and back.constrained_mask().any()
