"""Compaction by a plain-client summariser (no framework), on the fake vLLM: the agent loop
summarises its own history with a separate request whenever it grows, then goes on from
[system, summary, last tool turn]. Checked against the loop's own record of what it sent and got:
every completion trained exactly once, the summary calls segments of the agent's one trajectory
(labelled with `tito.labels(role="summarizer")` or `"summariser"`, or recognised unlabelled by
their quoted ids), trained with the episode's reward, and every segment after a summary says so.
A chat loop quotes its summaries inside a message ("Summary so far: ..."), re-tokenized."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.support.compaction_chat import SUMMARISE, run_chat
from tests.support.compaction_checks import (
    assert_each_call_trained_once,
    assert_one_linked_trajectory,
)
from tito_agents.samples import SUMMARIZER_ROLE
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeVLLM,
    FakeVLLMServer,
    RequestView,
    default_responder,
    hermes_tool_call,
    mock_transport,
)
from tito_agents.testing.smollm2 import MODEL_NAME

LAST_STEP = 7
KEEP_UNDER = 7
"""The loop summarises before a call whose history would hold this many messages."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up fact number `step`.",
            "parameters": {
                "type": "object",
                "properties": {"step": {"type": "integer"}},
                "required": ["step"],
            },
        },
    }
]


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
def server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(tokenization="canonical", responder=responder)) as fake:
        yield fake


def run_agent(client: openai.OpenAI, label: bool) -> tuple[list[str], list[str]]:
    """The agent loop; returns the ids of its completions and the summaries it wrote."""
    system = {"role": "system", "content": "Find all facts."}
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": "Look up every fact."}]
    completions: list[str] = []
    summaries: list[str] = []
    for _ in range(3 * LAST_STEP):
        if len(messages) >= KEEP_UNDER:
            transcript = "\n".join(str(m.get("content") or m.get("tool_calls")) for m in messages)
            scope = tito.labels(role=SUMMARIZER_ROLE) if label else nullcontext()
            with scope:
                done = client.chat.completions.create(
                    model=MODEL_NAME,
                    messages=[
                        {"role": "system", "content": "Summarise the work so far."},
                        {"role": "user", "content": transcript},
                    ],
                    max_tokens=64,
                )
            completions.append(done.id)
            summary = str(done.choices[0].message.content)
            summaries.append(summary)
            recap = {"role": "user", "content": f"Summary of the work so far:\n\n{summary}"}
            messages = [system, recap, *messages[-2:]]
        reply = client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=64
        )
        completions.append(reply.id)
        message = reply.choices[0].message
        if not message.tool_calls:
            return completions, summaries
        call = message.tool_calls[0]
        step = json.loads(call.function.arguments)["step"]
        messages.append(message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": f"fact {step} is known"}
        )
    raise AssertionError("the agent did not finish")


@pytest.mark.parametrize(
    ("label", "sessions"),
    [(True, False), (False, False), (True, True)],
    ids=["labelled", "unlabelled", "labelled-token-in-sessions"],
)
def test_plain_client_summariser_segments(
    server: FakeVLLMServer, label: bool, sessions: bool
) -> None:
    """With token-in sessions the turns between rewrites are sent token-in; a rewrite (the
    summariser's own request, the summarised history) falls back to rendering: same segments."""
    with tito.Collector(assembly="merged", capture_logprobs=True) as collector:
        client = collector.wrap(openai.OpenAI(base_url=server.base_url, api_key="EMPTY"))
        with (
            collector.episode("plain-compaction", sessions=sessions) as episode,
            tito.agent("solver"),
        ):
            completions, summaries = run_agent(client, label)
            episode.set_reward(1.0)
        samples = captured_samples(collector)
        client.close()

    assert len(summaries) >= 2
    if sessions:
        kinds = {c.session for c in episode.calls}
        assert "token_in" in kinds, kinds
    spans = [span for s in samples for span in s.spans]
    assert len(spans) == len(completions) == len({sp.call_id for sp in spans})
    assert {sp.call_id.rsplit("/", 1)[0] for sp in spans} == set(completions)  # the same calls
    assert sum(s.num_trained for s in samples) == sum(sp.end - sp.start for sp in spans)
    assert_one_linked_trajectory(samples, len(summaries))


def chat_responder(view: RequestView) -> str:
    if view.messages and view.messages[0].get("content") == SUMMARISE:
        named = " and ".join(re.findall(r"Name one (\w+)", view.prompt_text))
        return f"The user asked me to name one {named}, and each answer was a short sentence."
    return default_responder(view)


@pytest.mark.parametrize(
    ("role", "assembly", "where"),
    [
        ("summariser", "merged", "assistant"),
        ("summarizer", "merged", "assistant"),
        (None, "merged", "assistant"),
        (None, "merged", "user"),
        (None, "merged", "system"),
        ("summariser", "merged", "user"),
        ("summariser", "per_call", "assistant"),
        ("summarizer", "per_call", "assistant"),
    ],
)
def test_summary_quoted_inside_a_message_is_recognised(
    role: str | None, assembly: str, where: str
) -> None:
    """The summary comes back re-tokenized inside another message ("Summary so far: ..."), so its
    sampled ids do not appear verbatim; labelled in either spelling, or unlabelled, every summary
    is still recognised, and no call is lost or trained twice. Three episodes of eight calls."""
    fake = FakeVLLM(FakeConfig(responder=chat_responder))
    http = openai.DefaultHttpxClient(transport=mock_transport(fake))
    with tito.Collector(assembly=assembly, capture_logprobs=True) as collector:
        client = collector.wrap(
            openai.OpenAI(base_url="http://vllm.test/v1", api_key="EMPTY", http_client=http)
        )
        runs = []
        for index in range(3):
            with collector.episode(f"chat-{index}") as episode, tito.agent("chat"):
                sent, summaries = run_chat(client, MODEL_NAME, role, where)
                episode.set_reward(1.0)
            runs.append((episode, sent, summaries))
        client.close()

    for episode, sent, summaries in runs:
        samples = episode.samples
        assert len(sent) == 8 and summaries == 2
        assert_each_call_trained_once(samples, sent)
        assert sum(s.is_summary for s in samples) == summaries
        if assembly == "merged":
            assert_one_linked_trajectory(samples, summaries)
            assert [s.rewrite for s in samples].count("summary") == summaries
