"""Compaction under the Agents SDK, on the fake vLLM.

The SDK's own compaction, `agents.memory.OpenAIResponsesCompactionSession` (openai-agents 0.24),
calls OpenAI's server-side `responses.compact` endpoint and refuses non-OpenAI model names: the
summary is made by OpenAI's service, not sampled by the policy, so there is nothing to train and
vLLM serves no such endpoint. Its documented hook for rewriting a run's input is
`RunConfig.call_model_input_filter` (`agents.extensions.ToolOutputTrimmer` is one such filter);
here a filter summarises the history with a model call of its own, labelled
`tito_agents.labels(role="summarizer")`, whenever it grows. Checked against the SDK's own record
(`RunResult.raw_responses`, one per model call of the agent): every call trained exactly once, the
summaries segments of the agent's one trajectory, and every segment after a summary says so."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest
import tito_agents_openai_agents as tito_oa
from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.run_config import CallModelData, ModelInputData
from oa_script import new_client

import tito_agents as tito
from tito_agents.convert import group_advantages
from tito_agents.samples import SUMMARIZER_ROLE
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeVLLMServer,
    RequestView,
    default_responder,
    hermes_tool_call,
)
from tito_agents.testing.smollm2 import MODEL_NAME

LAST_STEP = 6
GROWN = 6
"""The filter summarises an input of this many items or more."""


@function_tool
def lookup(step: int) -> str:
    """Look up fact number `step`."""
    return f"fact {step} is known"


def responder(view: RequestView) -> str:
    if not view.tools:
        if "Summarise the work so far" in view.prompt_text:
            done = [int(k) for k in re.findall(r"fact (\d+) is known", view.prompt_text)]
            return f"Facts up to {max(done, default=0)} are looked up and all of them are fine."
        return default_responder(view)
    last = view.messages[-1]
    found = re.search(r"fact (\d+) is known", str(last.get("content") or ""))
    step = int(found.group(1)) + 1 if found and last.get("role") == "tool" else 1
    if step > LAST_STEP:
        return "All facts are known. Done."
    return hermes_tool_call("lookup", {"step": step})


@pytest.fixture(scope="module")
def compaction_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(tokenization="canonical", responder=responder)) as server:
        yield server


class Summariser:
    """A `call_model_input_filter` that replaces a grown history by a summary and the last turn."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.summaries: list[str] = []

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        items = list(data.model_data.input)
        if len(items) < GROWN:
            return data.model_data
        transcript = "\n".join(
            str(item.get("content") or item.get("output") or item.get("arguments"))
            for item in items
        )
        with tito.labels(role=SUMMARIZER_ROLE):
            done = await self.client.chat.completions.create(
                model=MODEL_NAME,
                messages=[
                    {"role": "system", "content": "Summarise the work so far."},
                    {"role": "user", "content": transcript},
                ],
                max_tokens=64,
            )
        summary = str(done.choices[0].message.content)
        self.summaries.append(summary)
        recap = {"role": "user", "content": f"Summary of the work so far:\n\n{summary}"}
        return ModelInputData(input=[recap, *items[-2:]], instructions=data.model_data.instructions)


async def test_input_filter_summariser_gives_linked_trained_segments(
    compaction_server: FakeVLLMServer,
) -> None:
    client = new_client(compaction_server)
    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        tito_oa.install(
            collector, client, model=MODEL_NAME, api="chat_completions", export_traces=False
        )
        summariser = Summariser(client)
        agent = Agent(
            name="researcher",
            instructions="Find all facts.",
            tools=[lookup],
            model_settings=ModelSettings(max_tokens=64),
        )
        async with collector.episode("oa-compaction") as episode:
            result = await Runner.run(
                agent,
                "Look up every fact.",
                run_config=RunConfig(call_model_input_filter=summariser),
                max_turns=3 * LAST_STEP,
            )
            episode.set_reward(1.0)
        samples = captured_samples(collector)
    await client.close()

    assert result.final_output == "All facts are known. Done."
    assert len(summariser.summaries) >= 2
    spans = [span for s in samples for span in s.spans]
    # the SDK's record: one raw response per agent model call; plus the filter's summaries
    assert len(spans) == len(result.raw_responses) + len(summariser.summaries)
    assert len({sp.call_id for sp in spans}) == len(spans)
    assert {s.agent for s in samples} == {"researcher"}
    assert {s.trajectory_id for s in samples} == {samples[0].trajectory_id}
    assert [s.segment_index for s in samples] == list(range(len(samples)))
    assert [s.prev_sample_id for s in samples[1:]] == [s.sample_id for s in samples[:-1]]
    assert sum(s.is_summary for s in samples) == len(summariser.summaries)
    for before, after in itertools.pairwise(samples):
        if before.is_summary:
            assert after.rewrite == "summary" and not after.is_summary
    assert all(s.reward == 1.0 for s in samples)
    assert len(set(group_advantages(samples, unit="trajectory").tolist())) == 1
