"""Attribution under load: 1,000 concurrent episodes over real HTTP never mix their calls."""

from __future__ import annotations

import asyncio
import random

import openai

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer


async def test_thousand_concurrent_episodes_never_mix(fake_server: FakeVLLMServer) -> None:
    """Each of 1,000 concurrent episodes (two turns, streaming and not, n=2 some) holds exactly its
    own calls: the prompt ids it captured decode to its own question."""
    collector = tito.Collector(capture_logprobs=True)
    client = collector.wrap(
        openai.AsyncOpenAI(
            base_url=fake_server.base_url,
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(
                limits=__import__("httpx2").Limits(max_connections=200)
            ),
        )
    )
    rng = random.Random(0)

    async def rollout(i: int) -> tito.Episode:
        async with collector.episode(f"ep-{i}", group_id=f"g{i % 10}") as ep:
            messages = [{"role": "user", "content": f"Question number {i}: say hello."}]
            for turn in range(2):
                await asyncio.sleep(rng.random() * 0.01)
                stream = (i + turn) % 2 == 0
                n = 2 if i % 7 == 0 and turn == 0 else 1
                response = await client.chat.completions.create(
                    model=MODEL_NAME, messages=messages, max_tokens=8, n=n, stream=stream
                )
                text = ""
                if stream:
                    async for chunk in response:
                        text += "".join(c.delta.content or "" for c in chunk.choices)
                else:
                    text = response.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"Again, question {i}."},
                ]
            ep.set_reward(float(i))
        return ep

    episodes = await asyncio.gather(*(rollout(i) for i in range(1000)))
    await client.close()
    tokenizer = load_tokenizer()
    misattributed = 0
    for i, ep in enumerate(episodes):
        assert len(ep.calls) == (3 if i % 7 == 0 else 2)
        for call in ep.calls:
            prompt_text = tokenizer.decode(call.prompt_ids.tolist())
            if call.episode_id != f"ep-{i}" or f"Question number {i}:" not in prompt_text:
                misattributed += 1
            assert call.status is tito.CallStatus.COMPLETE
    assert misattributed == 0
    samples = captured_samples(collector)
    assert len(samples) == sum(len(ep.calls) for ep in episodes)
    assert all(s.reward == float(s.episode_id.removeprefix("ep-")) for s in samples)
    assert collector.stats.complete_calls == len(samples)
