"""`Episode.set_call_reward` with every target a user has at hand: a `Call`, a call id, a
response id (all its choices), the response object, a stream's chunk; and what it refuses (a
stream object, a raw response, an unknown id, a reward that is not finite) with a message that
says what to pass instead."""

from __future__ import annotations

import math

import openai
import pytest

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

MSG = [{"role": "user", "content": "hi"}]


def _client(collector: tito.Collector) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(transport=mock_transport(FakeVLLM(FakeConfig())))
    return collector.wrap(
        openai.OpenAI(base_url="http://vllm.test/v1", api_key="x", http_client=http)
    )


def test_every_target_form_sets_the_reward_of_its_calls() -> None:
    with tito.Collector() as collector:
        client = _client(collector)
        with collector.episode("e") as ep:
            pair = client.chat.completions.create(model=MODEL_NAME, messages=MSG, n=2)
            ep.set_call_reward(pair.id, 1.0)  # the response id: both choices
            single = client.chat.completions.create(model=MODEL_NAME, messages=MSG)
            ep.set_call_reward(single, 2.0)  # the response object
            chunks = list(
                client.chat.completions.create(model=MODEL_NAME, messages=MSG, stream=True)
            )
            ep.set_call_reward(chunks[-1], 3.0)  # a chunk of a stream
            by_call = client.chat.completions.create(model=MODEL_NAME, messages=MSG)
            call = next(c for c in ep.calls if c.request_id == by_call.id)
            ep.set_call_reward(call, 4.0)  # the Call
            ep.set_call_reward(f"{pair.id}/1", 5.0)  # one call id overrides its choice
    rewards = {s.call_ids[0]: s.reward for s in captured_samples(collector)}
    assert sorted(rewards.values()) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert rewards[f"{pair.id}/0"] == 1.0 and rewards[f"{pair.id}/1"] == 5.0


def test_targets_it_cannot_read_are_refused_with_what_to_pass() -> None:
    with tito.Collector() as collector:
        client = _client(collector)
        with collector.episode("e") as ep:
            stream = client.chat.completions.create(model=MODEL_NAME, messages=MSG, stream=True)
            list(stream)
            with pytest.raises(TypeError, match="one of its chunks"):
                ep.set_call_reward(stream, 1.0)
            raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=MSG)
            with pytest.raises(TypeError, match=r"raw\.parse\(\)"):
                ep.set_call_reward(raw, 1.0)
            ep.set_call_reward(raw.parse(), 1.0)  # as the message says
            with pytest.raises(KeyError, match="no captured call"):
                ep.set_call_reward("chatcmpl-unknown", 1.0)
            with pytest.raises(ValueError, match="finite"):
                ep.set_call_reward(raw.parse(), math.nan)
