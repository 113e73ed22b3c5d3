"""End-to-end: LangChain's `SummarizationMiddleware` on a `create_agent`, unmodified, on the real CPU
vLLM. A chat agent gets four user turns in one episode; the middleware summarises its history when
it grows (with the agent's own model). Checked against LangChain's own record of the run (every chat
model run its callbacks saw, and which of them were the middleware's summaries): every call trained
exactly once, the summaries are segments of the agent's one trajectory, marked and trained with the
episode's reward, and the segment after each summary says so. About 8 short generations."""

from __future__ import annotations

import itertools
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_openai import ChatOpenAI
from tito_agents_langchain import TitoCallbackHandler, wrap

import tito_agents as tito
from tito_agents.convert import group_advantages

pytestmark = pytest.mark.e2e

TURNS = ("Name a fruit.", "Name a colour.", "Name an animal.", "Name a city.")


class ModelRuns(BaseCallbackHandler):
    """LangChain's own record: every chat model run and its metadata."""

    run_inline = True

    def __init__(self) -> None:
        self.runs: dict[UUID, dict[str, Any]] = {}

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.runs[run_id] = dict(kwargs.get("metadata") or {})


async def test_summarization_middleware_on_real_vllm(vllm_base_url: str, vllm_model: str) -> None:
    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        model = wrap(
            ChatOpenAI(
                base_url=vllm_base_url,
                model=vllm_model,
                api_key="EMPTY",  # type: ignore[arg-type]
                max_tokens=24,
                temperature=0.7,
            ),
            collector,
        )
        agent = create_agent(
            model,
            [],
            system_prompt="Answer in one short sentence.",
            name="chat",
            middleware=[
                SummarizationMiddleware(model=model, trigger=("messages", 5), keep=("messages", 2))
            ],
        )
        record = ModelRuns()
        handler = TitoCallbackHandler(collector)
        messages: list[Any] = []
        async with collector.episode("e2e-compaction") as episode:
            for text in TURNS:
                state = await agent.ainvoke(
                    {"messages": [*messages, {"role": "user", "content": text}]},
                    config={"callbacks": [handler, record]},
                )
                messages = state["messages"]
            episode.set_reward(1.0)
        samples = episode.samples

    summaries = [m for m in record.runs.values() if m.get("lc_source") == "summarization"]
    assert summaries, "the middleware never summarised"
    spans = [span for s in samples for span in s.spans]
    assert len(spans) == len(record.runs) == len({sp.call_id for sp in spans})
    assert all(sp.end > sp.start for sp in spans)
    assert sum(s.num_trained for s in samples) == sum(sp.end - sp.start for sp in spans)
    assert {s.agent for s in samples} == {"chat"}
    assert {s.trajectory_id for s in samples} == {samples[0].trajectory_id}
    assert [s.segment_index for s in samples] == list(range(len(samples)))
    assert [s.prev_sample_id for s in samples[1:]] == [s.sample_id for s in samples[:-1]]
    assert sum(s.is_summary for s in samples) == len(summaries)
    for before, after in itertools.pairwise(samples):
        if before.is_summary:
            assert after.rewrite == "summary" and not after.is_summary
    assert all(s.reward == 1.0 for s in samples)
    assert len(set(group_advantages(samples, unit="trajectory").tolist())) == 1
