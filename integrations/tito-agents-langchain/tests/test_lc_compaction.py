"""Compaction, unmodified: `create_agent` with LangChain's own `SummarizationMiddleware`, on the fake
vLLM. The agent looks facts up one by one; the middleware summarises its history twice on the way.
Checked against the framework's own record of the run (every chat model run its callbacks saw, the
summaries it put into the agent's state, the call ids on the messages it kept): each model call is
trained exactly once, the summary calls are segments of the agent's one trajectory, labelled and
trained with the episode's reward, and the segment after each summary says so."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from lc_support import MakeModel
from tito_agents_langchain import TitoCallbackHandler, wrap

import tito_agents as tito
from tito_agents.convert import group_advantages
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeVLLMServer,
    RequestView,
    default_responder,
    hermes_tool_call,
)

LAST_STEP = 6
SUMMARY = "Summary so far: the user wants all facts; steps up to {k} are looked up, each one fine."


@tool
def lookup(step: int) -> str:
    """Look up fact number `step`."""
    return f"fact {step} is known"


def _text(message: Any) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def responder(view: RequestView) -> str:
    """A summariser when asked to summarise, else an agent that looks facts up in order."""
    if not view.tools:
        if "Context Extraction Assistant" in view.prompt_text:
            done = [int(k) for k in re.findall(r"fact (\d+) is known", view.prompt_text)]
            return SUMMARY.format(k=max(done, default=0))
        return default_responder(view)
    last = view.messages[-1]
    found = re.search(r"fact (\d+) is known", _text(last)) if last.get("role") == "tool" else None
    step = int(found.group(1)) + 1 if found else 1
    if step > LAST_STEP:
        return "All facts are known. Done."
    return hermes_tool_call("lookup", {"step": step})


class ModelRuns(BaseCallbackHandler):
    """The framework's own record: every chat model run LangChain started, and its metadata."""

    run_inline = True

    def __init__(self) -> None:
        self.runs: dict[UUID, dict[str, Any]] = {}

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self.runs[run_id] = dict(kwargs.get("metadata") or {})


@pytest.fixture(scope="module")
def compaction_server() -> Any:
    with FakeVLLMServer(FakeConfig(tokenization="canonical", responder=responder)) as server:
        yield server


@pytest.mark.parametrize("name", ["researcher", None])
async def test_summarization_middleware_gives_linked_trained_segments(
    compaction_server: FakeVLLMServer, make_model: MakeModel, name: str | None
) -> None:
    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        model = wrap(make_model(base_url=compaction_server.base_url, max_tokens=64), collector)
        middleware = SummarizationMiddleware(
            model=model, trigger=("messages", 6), keep=("messages", 2)
        )
        agent = create_agent(
            model, [lookup], system_prompt="Find all facts.", middleware=[middleware], name=name
        )
        record = ModelRuns()
        handler = TitoCallbackHandler(collector, reward_fn=lambda _: 1.0)
        state = await agent.ainvoke(
            {"messages": [{"role": "user", "content": "Look up every fact."}]},
            config={"callbacks": [handler, record], "metadata": {"episode_id": "compact"}},
        )
        samples = captured_samples(collector)

    summaries_in_state = [
        m for m in state["messages"] if isinstance(m, HumanMessage) and "Summary so far" in m.text
    ]
    assert len(summaries_in_state) == 1  # the latest summary replaced the earlier history
    summary_runs = [m for m in record.runs.values() if m.get("lc_source") == "summarization"]
    assert len(summary_runs) == 2  # the middleware compacted twice

    # every model run LangChain saw is one trained call, in exactly one sample
    spans = [span for s in samples for span in s.spans]
    assert len(spans) == len(record.runs) == len({span.call_id for span in spans})
    assert sum(s.num_trained for s in samples) == sum(span.end - span.start for span in spans)
    kept = {
        m.response_metadata["tito"]["call_id"]
        for m in state["messages"]
        if isinstance(m, AIMessage)
    }
    assert kept <= {span.call_id for span in spans}

    # one trajectory, linked, summaries marked and trained with the episode's reward
    assert {s.agent for s in samples} == {samples[0].agent}
    assert {s.trajectory_id for s in samples} == {samples[0].trajectory_id}
    assert [s.segment_index for s in samples] == list(range(len(samples)))
    assert [s.prev_sample_id for s in samples[1:]] == [s.sample_id for s in samples[:-1]]
    assert [s.is_summary for s in samples] == [False, True, False, True, False]
    assert [s.rewrite for s in samples] == [None, None, "summary", None, "summary"]
    assert all(s.reward == 1.0 for s in samples)
    assert len(set(group_advantages(samples, unit="trajectory").tolist())) == 1
    summary_spans = [sp for s in samples if s.is_summary for sp in s.spans]
    assert all(sp.role == "summarizer" for sp in summary_spans)
    assert all(sp.start < sp.end for sp in summary_spans)  # their tokens are trained
