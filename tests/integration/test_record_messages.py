"""`Collector(record_messages=True)`: each call's chat request in its samples, for `drift
--chat-template`; off by default."""

from __future__ import annotations

import httpx
import openai

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.smollm2 import MODEL_NAME


def test_record_messages_writes_each_calls_request_into_its_samples() -> None:
    """Opt-in: `record_messages=True` persists the chat request of each call for `drift
    --chat-template`; by default nothing of the conversation is written."""
    from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport

    messages = [{"role": "user", "content": "hello"}]
    for record in (False, True):
        collector = tito.Collector(record_messages=record)
        assert collector.settings.record_messages is record
        client = collector.wrap(
            openai.OpenAI(
                base_url="http://vllm.test/v1",
                api_key="x",
                http_client=httpx.Client(transport=mock_transport(FakeVLLM(FakeConfig()))),
            )
        )
        with collector.episode():
            client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4)
        (sample,) = captured_samples(collector)
        if record:
            (request,) = sample.metadata["call_messages"].values()
            assert request["messages"] == messages
        else:
            assert "call_messages" not in sample.metadata
