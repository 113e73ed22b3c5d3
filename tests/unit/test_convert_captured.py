"""Converters on samples captured from the fake vLLM server: a tool-calling agent, two rollouts of
one task, checked against the ids and logprobs each captured call recorded."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import openai
import pytest

import tito_agents as tito
from tito_agents import Call, Sample
from tito_agents.assembly import EpisodeContext, assemble_merged
from tito_agents.convert import pack_batch, pad_batch, to_trl_rollout, to_verl_batch
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_RESULT = "sunny and 23 degrees"


@dataclass
class Rollout:
    calls: list[Call]
    per_call: list[Sample]
    merged: Sample


@pytest.fixture(scope="module")
def rollouts() -> Iterator[list[Rollout]]:
    """Two episodes of one task (rewards 1 and 0): a tool call, the tool result, a final answer."""
    out: list[Rollout] = []
    with FakeVLLMServer(FakeConfig()) as server:
        collector = tito.Collector(capture_logprobs=True)
        client = collector.wrap(openai.OpenAI(base_url=server.base_url, api_key="x"))
        try:
            for reward in (1.0, 0.0):
                with collector.episode(task_id="weather", group_id="weather-g") as episode:
                    messages: list[dict[str, object]] = [
                        {"role": "user", "content": "What is the weather in Paris?"}
                    ]
                    first = client.chat.completions.create(
                        model=MODEL_NAME, messages=messages, tools=[WEATHER_TOOL], max_tokens=64
                    )
                    message = first.choices[0].message
                    assert message.tool_calls
                    messages.append(message.model_dump(exclude_none=True))
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": message.tool_calls[0].id,
                            "content": TOOL_RESULT,
                        }
                    )
                    client.chat.completions.create(
                        model=MODEL_NAME, messages=messages, tools=[WEATHER_TOOL], max_tokens=32
                    )
                    episode.set_reward(reward)
                calls = list(episode.calls)
                merged, divergences = assemble_merged(
                    calls,
                    EpisodeContext(episode.episode_id, reward, "weather", "weather-g"),
                )
                assert len(merged) == 1 and not divergences
                assert isinstance(collector.sink, tito.sinks.MemorySink)
                per_call = [
                    s for s in captured_samples(collector) if s.episode_id == episode.episode_id
                ]
                out.append(Rollout(calls=calls, per_call=per_call, merged=merged[0]))
        finally:
            client.close()
            collector.close()
    yield out


def expected_response(calls: list[Call]) -> tuple[list[int], list[int], list[float]]:
    """What follows the first call's prompt, from the calls alone: sampled ids (loss 1), the second
    prompt's new tokens (tool result + template, loss 0), the second call's sampled ids."""
    first, second = calls
    assert first.logprobs is not None and second.logprobs is not None
    tip = first.prompt_ids.shape[0] + first.sampled_ids.shape[0]
    context = second.prompt_ids[tip:].tolist()
    ids = first.sampled_ids.tolist() + context + second.sampled_ids.tolist()
    mask = [1] * first.sampled_ids.shape[0] + [0] * len(context) + [1] * second.sampled_ids.shape[0]
    logprobs = first.logprobs.tolist() + [0.0] * len(context) + second.logprobs.tolist()
    return ids, mask, logprobs


def test_verl_batch_of_captured_merged_samples_matches_the_calls(rollouts: list[Rollout]) -> None:
    """verl rows of captured merged samples: first prompt left-padded, then both calls' sampled ids
    with mask 1 and logprobs, the tool turn between them with mask 0, reward on the last token."""
    batch = to_verl_batch([r.merged for r in rollouts], pad_id=2)
    assert batch.rollout_log_probs is not None and batch.rm_scores is not None
    for b, rollout in enumerate(rollouts):
        prompt = rollout.calls[0].prompt_ids.tolist()
        valid_prompt = batch.prompts[b][batch.prompts.shape[1] - len(prompt) :]
        assert valid_prompt.tolist() == prompt
        assert set(batch.prompts[b][: batch.prompts.shape[1] - len(prompt)].tolist()) <= {2}
        ids, mask, logprobs = expected_response(rollout.calls)
        n = len(ids)
        assert batch.responses[b][:n].tolist() == ids
        assert batch.response_mask[b].tolist() == mask + [0] * (batch.responses.shape[1] - n)
        np.testing.assert_array_equal(batch.rollout_log_probs[b][:n], np.float32(logprobs))
        assert not batch.rollout_log_probs[b][n:].any()
        assert np.flatnonzero(batch.rm_scores[b]).tolist() in ([n - 1], [])
        assert batch.rm_scores[b][n - 1] == rollout.merged.reward
    assert batch.uid.tolist() == ["weather-g", "weather-g"]


def test_trl_env_mask_of_captured_samples_marks_the_tool_result(rollouts: list[Rollout]) -> None:
    """In TRL's completion, env_mask is 0 on exactly the tokens of the tool turn, which decode to
    the tool result; every sampled token is 1."""
    tokenizer = load_tokenizer()
    out = to_trl_rollout([r.merged for r in rollouts])
    for b, rollout in enumerate(rollouts):
        ids, mask, logprobs = expected_response(rollout.calls)
        assert out["prompt_ids"][b] == rollout.calls[0].prompt_ids.tolist()
        assert out["completion_ids"][b] == ids
        assert out["env_mask"][b] == mask
        assert out["logprobs"][b] == pytest.approx(logprobs)
        env_tokens = [t for t, m in zip(ids, mask, strict=True) if m == 0]
        assert TOOL_RESULT in tokenizer.decode(env_tokens)
    assert out["reward"] == [1.0, 0.0]


def test_generic_layouts_of_captured_per_call_samples(rollouts: list[Rollout]) -> None:
    """Per-call samples pad and pack to each call's prompt + sampled ids, loss 1 on the sampled."""
    samples = [s for r in rollouts for s in r.per_call]
    calls = {c.call_id: c for r in rollouts for c in r.calls}
    padded = pad_batch(samples, padding_side="left", pad_id=2)
    packed = pack_batch(samples)
    for b, sample in enumerate(samples):
        call = calls[sample.call_ids[0]]
        full = call.prompt_ids.tolist() + call.sampled_ids.tolist()
        mask = [0] * call.prompt_ids.shape[0] + [1] * call.sampled_ids.shape[0]
        assert padded.input_ids[b][padded.input_ids.shape[1] - len(full) :].tolist() == full
        assert padded.loss_mask[b][padded.input_ids.shape[1] - len(full) :].tolist() == mask
        lo, hi = packed.cu_seqlens[b], packed.cu_seqlens[b + 1]
        assert packed.input_ids[lo:hi].tolist() == full
        assert packed.position_ids[lo:hi].tolist() == list(range(len(full)))
