"""End-to-end: LangChain's `SummarizationMiddleware` on a `create_agent`, unmodified, on the real CPU
vLLM. A chat agent gets four user turns in one episode; the middleware summarises its history when
it grows (with the agent's own model). Checked against LangChain's own record of the run (every chat
model run its callbacks saw, and which of them were the middleware's summaries): every call trained
exactly once, the summaries are segments of the agent's one trajectory, marked and trained with the
episode's reward, and the segment after each summary says so. About 8 short generations."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_openai import ChatOpenAI
from tito_agents_langchain import TitoCallbackHandler, wrap

import tito_agents as tito
from tests.support.compaction_chat import run_chat
from tests.support.compaction_checks import (
    assert_each_call_trained_once,
    assert_one_linked_trajectory,
)

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
    assert_one_linked_trajectory(samples, len(summaries))


def test_plain_client_summariser_on_real_vllm(vllm_base_url: str, vllm_model: str) -> None:
    """The same promises for a summariser written with a plain openai client (no framework):
    the loop summarises its history in a labelled call when it grows, then goes on from
    [system, summary, last exchange]. Checked against the loop's own record of its calls."""
    import openai

    from tito_agents.samples import SUMMARIZER_ROLE

    system = {"role": "system", "content": "Answer in one short sentence."}
    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
        sent: list[str] = []
        summaries = 0
        with collector.episode("e2e-plain-compaction") as episode, tito.agent("solver"):
            messages: list[Any] = [system]
            for text in TURNS:
                if len(messages) >= 5:
                    transcript = "\n".join(str(m["content"]) for m in messages[1:])
                    with tito.labels(role=SUMMARIZER_ROLE):
                        done = client.chat.completions.create(
                            model=vllm_model,
                            messages=[
                                {"role": "system", "content": "Summarise this conversation."},
                                {"role": "user", "content": transcript},
                            ],
                            max_tokens=24,
                        )
                    sent.append(done.id)
                    summaries += 1
                    recap = f"Summary so far: {done.choices[0].message.content}"
                    messages = [system, {"role": "user", "content": recap}, *messages[-2:]]
                messages.append({"role": "user", "content": text})
                reply = client.chat.completions.create(
                    model=vllm_model, messages=messages, max_tokens=24, temperature=0.7
                )
                sent.append(reply.id)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            episode.set_reward(1.0)
        samples = episode.samples
        client.close()

    assert summaries >= 1
    spans = [span for s in samples for span in s.spans]
    assert {sp.call_id.rsplit("/", 1)[0] for sp in spans} == set(sent)
    assert len(spans) == len(sent) == len({sp.call_id for sp in spans})
    assert sum(s.num_trained for s in samples) == sum(sp.end - sp.start for sp in spans)
    assert_one_linked_trajectory(samples, summaries)


def test_summary_quoted_with_a_prefix_on_real_vllm(vllm_base_url: str, vllm_model: str) -> None:
    """A plain-client chat loop labelling its summariser `role="summariser"` (British spelling)
    and quoting each summary in the next prompt as an assistant message "Summary so far: ...",
    which vLLM re-tokenizes: three episodes of eight calls (two summaries each). Every summary is
    recognised (the summariser's segment `is_summary`, the next one `rewrite == "summary"`), no
    call is lost or trained twice, the segments are linked. 24 short generations."""
    import openai

    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        client = collector.wrap(openai.OpenAI(base_url=vllm_base_url, api_key="EMPTY"))
        runs = []
        for index in range(3):
            with collector.episode(f"e2e-quoted-{index}") as episode, tito.agent("chat"):
                sent, summaries = run_chat(client, vllm_model, "summariser", max_tokens=24)
                episode.set_reward(1.0)
            runs.append((episode.samples, sent, summaries))
        client.close()

    for samples, sent, summaries in runs:
        assert len(sent) == 8 and summaries == 2
        assert_each_call_trained_once(samples, sent)
        assert_one_linked_trajectory(samples, summaries)
        assert [s.rewrite for s in samples].count("summary") == summaries


async def test_agents_sdk_input_filter_summariser_on_real_vllm(
    vllm_base_url: str, vllm_model: str
) -> None:
    """The Agents SDK's documented hook for rewriting a run's input,
    `RunConfig.call_model_input_filter`, summarising the history with a labelled model call of its
    own once it grows (the SDK's `OpenAIResponsesCompactionSession` has OpenAI's server summarise:
    nothing sampled to train; docs/openai-agents.md). Four runs of one conversation; checked
    against the SDK's own record (`RunResult.raw_responses`) plus the filter's summaries."""
    import openai
    import tito_agents_openai_agents as tito_oa
    from agents import Agent, ModelSettings, RunConfig, Runner
    from agents.run_config import CallModelData, ModelInputData

    from tito_agents.samples import SUMMARIZER_ROLE

    client = openai.AsyncOpenAI(base_url=vllm_base_url, api_key="EMPTY")
    summaries: list[str] = []

    async def summarise(data: CallModelData[Any]) -> ModelInputData:
        items = list(data.model_data.input)
        if len(items) < 4:
            return data.model_data
        transcript = "\n".join(str(item.get("content")) for item in items)
        with tito.labels(role=SUMMARIZER_ROLE):
            done = await client.chat.completions.create(
                model=vllm_model,
                messages=[
                    {"role": "system", "content": "Summarise this conversation."},
                    {"role": "user", "content": transcript},
                ],
                max_tokens=24,
            )
        summaries.append(str(done.choices[0].message.content))
        recap = {"role": "user", "content": f"Summary so far: {summaries[-1]}"}
        return ModelInputData(input=[recap, *items[-1:]], instructions=data.model_data.instructions)

    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        tito_oa.install(
            collector, client, model=vllm_model, api="chat_completions", export_traces=False
        )
        agent = Agent(
            name="chat",
            instructions="Answer in one short sentence.",
            model_settings=ModelSettings(max_tokens=24, temperature=0.7),
        )
        raw = 0
        history: list[Any] = []
        async with collector.episode("e2e-oa-compaction") as episode:
            for text in TURNS:
                result = await Runner.run(
                    agent,
                    [*history, {"role": "user", "content": text}],
                    run_config=RunConfig(call_model_input_filter=summarise),
                )
                raw += len(result.raw_responses)
                history = result.to_input_list()
            episode.set_reward(1.0)
        samples = episode.samples
    await client.close()

    assert summaries
    spans = [span for s in samples for span in s.spans]
    assert len(spans) == raw + len(summaries) == len({sp.call_id for sp in spans})
    assert sum(s.num_trained for s in samples) == sum(sp.end - sp.start for sp in spans)
    assert {s.agent for s in samples} == {"chat"}
    assert_one_linked_trajectory(samples, len(summaries))
