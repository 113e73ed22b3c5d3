"""`TitoCallbackHandler`: one episode per root run, run-tree and LangGraph node labels, ids on
messages, rewards, and loud warnings for set-ups that lose calls."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import openai
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tracers._streaming import (
    _StreamingCallbackHandler,
    _V2StreamingCallbackHandler,
)
from langgraph.graph import START, MessagesState, StateGraph
from lc_support import MakeModel, ai_messages, decode, react_graph
from tito_agents_langchain import (
    CaptureWarning,
    TitoCallbackHandler,
    call_id_of,
    current_episode,
    node_agent,
    set_step_reward,
    wrap,
)

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

QUESTION: MessagesState = {"messages": [HumanMessage("What is the weather in Paris?")]}


def samples_of(collector: tito.Collector) -> list[tito.Sample]:
    return captured_samples(collector)


async def test_a_graph_invocation_is_one_episode_labelled_by_node_and_run(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A ReAct graph run writes one episode (ids from the root metadata) whose calls carry the
    node, the step and the run tree (root run, the node run as parent) when the run ends."""
    handler = TitoCallbackHandler(collector)
    graph = react_graph(wrap(make_model(), collector))
    root = uuid.uuid4()
    metadata = {"episode_id": "ep-1", "task_id": "weather", "group_id": "g1"}
    result = await graph.ainvoke(
        QUESTION, config={"callbacks": [handler], "metadata": metadata, "run_id": root}
    )
    samples = samples_of(collector)
    assert [s.episode_id for s in samples] == ["ep-1", "ep-1"]
    assert {(s.task_id, s.group_id, s.agent) for s in samples} == {("weather", "g1", "agent")}
    labels = [s.metadata["labels"] for s in samples]
    assert [label["langgraph_step"] for label in labels] == [1, 3]
    assert all(label["lc_root_run_id"] == str(root) for label in labels)
    assert all(label["lc_parent_run_id"] not in (str(root), label["lc_run_id"]) for label in labels)
    assert [call_id_of(m) for m in ai_messages(result)] == [s.call_ids[0] for s in samples]
    assert handler.last_episode is not None and handler.last_episode.episode_id == "ep-1"


@pytest.mark.parametrize("mode", ["sync invoke, sync node", "async invoke, sync node"])
async def test_sync_paths_attribute_like_async(
    mode: str, make_model: MakeModel, collector: tito.Collector
) -> None:
    """Sync graphs and sync nodes on executor threads get the same episode and node labels."""
    handler = TitoCallbackHandler(collector)
    graph = react_graph(wrap(make_model(), collector), sync_node=True)
    config: Any = {"callbacks": [handler], "metadata": {"episode_id": "ep-s"}}
    if mode.startswith("sync"):
        graph.invoke(QUESTION, config=config)
    else:
        await graph.ainvoke(QUESTION, config=config)
    samples = samples_of(collector)
    assert [(s.episode_id, s.agent) for s in samples] == [("ep-s", "agent"), ("ep-s", "agent")]


async def test_multi_node_graph_yields_per_node_trajectories(
    make_model: MakeModel, collector: tito.Collector, tokenizer: Any
) -> None:
    """Each top-level node's calls (parallel branches, and a subgraph node for its inner node's
    calls) carry that node as their agent; `agent_from=node_agent` labels the inner node instead.
    The handler attached with with_config() scopes the one episode."""
    llm = wrap(make_model(), collector)

    def node(prompt: str) -> Any:
        async def call(state: MessagesState) -> dict[str, Any]:
            return {"messages": [await llm.ainvoke(prompt)]}

        return call

    inner = StateGraph(MessagesState)
    inner.add_node("draft", node("Draft: a line about Oslo."))
    inner.add_edge(START, "draft")
    outer = StateGraph(MessagesState)
    outer.add_node("researcher", node("Research: facts about Oslo."))
    outer.add_node("critic", node("Critic: doubts about Oslo."))
    outer.add_node("writer", inner.compile())
    for branch in ("researcher", "critic"):  # two branches in parallel, then the writer
        outer.add_edge(START, branch)
        outer.add_edge(branch, "writer")
    handler = TitoCallbackHandler(collector)
    await outer.compile().with_config(callbacks=[handler]).ainvoke(QUESTION)
    by_agent = {s.agent: s for s in samples_of(collector)}
    assert set(by_agent) == {"researcher", "critic", "writer"}
    for agent, prefix in (("researcher", "Research:"), ("critic", "Critic:"), ("writer", "Draft:")):
        assert prefix in decode(tokenizer, by_agent[agent].token_ids)
        assert by_agent[agent].metadata["labels"]["agent_path"] == agent
    labels = by_agent["writer"].metadata["labels"]
    assert labels["langgraph_checkpoint_ns"].startswith("writer:")
    assert labels["langgraph_node"] == "draft"
    assert len({s.episode_id for s in by_agent.values()}) == 1

    per_node = TitoCallbackHandler(collector, agent_from=node_agent)
    await outer.compile().with_config(callbacks=[per_node]).ainvoke(QUESTION)
    assert {s.agent for s in samples_of(collector)[3:]} == {"researcher", "critic", "draft"}


async def test_streamed_model_messages_carry_call_and_token_ids(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A streaming model's AIMessages get their call id and exact token ids in response_metadata."""
    handler = TitoCallbackHandler(collector, attach_token_ids=True)
    graph = react_graph(wrap(make_model(streaming=True), collector))
    result = await graph.ainvoke(QUESTION, config={"callbacks": [handler]})
    calls = {c.call_id: c for c in handler.last_episode.calls}  # type: ignore[union-attr]
    messages = ai_messages(result)
    assert len(messages) == 2 and all(c.stream for c in calls.values())
    for message in messages:
        entry = message.response_metadata["tito"]
        call = calls[entry["call_id"]]
        assert entry["token_ids"] == call.sampled_ids.tolist()
        assert entry["prompt_token_ids"] == call.prompt_ids.tolist()


async def test_a_bare_model_run_is_an_episode(
    make_model: MakeModel, collector: tito.Collector, tokenizer: Any
) -> None:
    """A model invoked on its own with the handler is its own episode; abatch inputs never mix."""
    handler = TitoCallbackHandler(collector)
    llm = wrap(make_model(), collector)
    questions = [f"Question {i}: tell me about Tokyo." for i in range(4)]
    await llm.abatch(list[LanguageModelInput](questions), config={"callbacks": [handler]})
    llm.invoke(questions[0], config={"callbacks": [handler]})
    samples = samples_of(collector)
    assert len(samples) == 5 and len({s.episode_id for s in samples}) == 5
    for sample in samples:
        assert sample.episode_id == sample.metadata["labels"]["lc_run_id"]
    prompts = sorted(decode(tokenizer, s.token_ids) for s in samples[:4])
    assert all(q in p for q, p in zip(questions, prompts, strict=True))


async def test_reward_fn_scores_the_outputs(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """reward_fn sees the root run's outputs; its value is every sample's reward."""

    def score(outputs: Any) -> float:
        return 1.0 if "sunny" in outputs["messages"][-1].content else 0.0

    handler = TitoCallbackHandler(collector, reward_fn=score)
    await react_graph(wrap(make_model(), collector)).ainvoke(
        QUESTION, config={"callbacks": [handler]}
    )
    assert [s.reward for s in samples_of(collector)] == [1.0, 1.0]


async def test_await_reward_holds_episodes_until_rewarded(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """With await_reward, ended episodes wait for set_reward (by result, run id or episode id)."""
    handler = TitoCallbackHandler(collector, await_reward=True)
    graph = react_graph(wrap(make_model(), collector))
    runs = [uuid.uuid4() for _ in range(3)]
    results = [
        await graph.ainvoke(
            QUESTION,
            config={"callbacks": [handler], "run_id": run, "metadata": {"episode_id": f"e{i}"}},
        )
        for i, run in enumerate(runs)
    ]
    assert samples_of(collector) == [] and len(handler.pending_episodes) == 3
    handler.set_reward(results[0], 0.25)
    handler.set_reward(runs[1], 0.5)
    handler.set_reward("e2", 0.75)
    rewards = {s.episode_id: s.reward for s in samples_of(collector)}
    assert rewards == {"e0": 0.25, "e1": 0.5, "e2": 0.75}
    assert handler.pending_episodes == [] and handler.finish_pending() == 0
    with pytest.raises(KeyError, match="await_reward"):
        handler.set_reward("e0", 1.0)


async def test_a_node_rewards_its_step(make_model: MakeModel, collector: tito.Collector) -> None:
    """A node finds its episode and rewards the call behind a message in the state."""
    llm = wrap(make_model(), collector)
    seen: list[tito.Episode | None] = []

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def judge(state: MessagesState) -> dict[str, Any]:
        seen.append(current_episode())
        set_step_reward(0.5, message=state["messages"][-1])
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("judge", judge)
    graph.add_edge(START, "agent")
    graph.add_edge("agent", "judge")
    handler = TitoCallbackHandler(collector, reward_fn=lambda _: 1.0)
    await graph.compile().ainvoke(QUESTION, config={"callbacks": [handler]})
    assert seen == [handler.last_episode]
    assert [s.reward for s in samples_of(collector)] == [0.5]  # the call's own reward wins


async def test_a_failed_run_writes_no_samples(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A root run that raises ends its episode without samples (no trustworthy reward)."""
    llm = wrap(make_model(), collector)

    async def agent(state: MessagesState) -> dict[str, Any]:
        await llm.ainvoke(state["messages"])
        raise RuntimeError("tool crashed")

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    handler = TitoCallbackHandler(collector)
    with pytest.raises(RuntimeError, match="tool crashed"):
        await graph.compile().ainvoke(QUESTION, config={"callbacks": [handler]})
    assert samples_of(collector) == [] and collector.stats.failed_episodes == 1
    assert handler.last_episode is not None and len(handler.last_episode.calls) == 1


async def test_a_run_inside_an_explicit_episode_joins_it(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """Inside the user's own collector.episode(), the handler labels calls but the user's scope
    owns the episode and writes it."""
    handler = TitoCallbackHandler(collector)
    graph = react_graph(wrap(make_model(), collector))
    async with collector.episode("mine") as episode:
        await graph.ainvoke(QUESTION, config={"callbacks": [handler]})
        assert samples_of(collector) == []
        episode.set_reward(2.0)
    samples = samples_of(collector)
    assert [(s.episode_id, s.agent, s.reward) for s in samples] == [("mine", "agent", 2.0)] * 2


async def test_unwrapped_model_under_the_handler_warns_once(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A model the handler sees but nobody wrapped raises one CaptureWarning, not silence."""
    handler = TitoCallbackHandler(collector)
    graph = react_graph(make_model())
    with pytest.warns(CaptureWarning, match="Wrap the model") as caught:
        for _ in range(2):
            await graph.ainvoke(QUESTION, config={"callbacks": [handler]})
    assert len(caught) == 1 and samples_of(collector) == []


async def test_wrapped_model_without_the_handler_warns_once(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A wrapped model called outside any episode (no handler) raises one CaptureWarning."""
    graph = react_graph(wrap(make_model(), collector))
    with pytest.warns(CaptureWarning, match="outside any episode") as caught:
        for _ in range(2):
            await graph.ainvoke(QUESTION)
    assert len(caught) == 1
    assert {s.episode_id for s in samples_of(collector)} == {"default"}


async def test_a_correct_setup_is_silent(make_model: MakeModel, collector: tito.Collector) -> None:
    """Wrapped model plus handler: no warning at all."""
    handler = TitoCallbackHandler(collector)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await react_graph(wrap(make_model(), collector)).ainvoke(
            QUESTION, config={"callbacks": [handler]}
        )
    assert len(samples_of(collector)) == 2


def test_the_callbacks_are_cheap_for_langchain(make_model: MakeModel) -> None:
    """The handler and the marker wrap() adds run inline, never raise into the run, do no
    per-token work and do not switch models into streaming."""
    collector = tito.Collector()
    (marker,) = wrap(make_model(), collector).callbacks  # type: ignore[misc]
    for handler in (TitoCallbackHandler(collector), marker):
        assert handler.run_inline is True and handler.raise_error is False
        assert type(handler).on_llm_new_token is BaseCallbackHandler.on_llm_new_token
        assert type(handler).on_stream_event is BaseCallbackHandler.on_stream_event
        assert not isinstance(handler, _StreamingCallbackHandler | _V2StreamingCallbackHandler)


async def test_message_ids_join_to_samples(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """The call id on a returned AIMessage names the sample holding that message's tokens."""
    handler = TitoCallbackHandler(collector)
    message = await wrap(make_model(), collector).ainvoke("Hi!", config={"callbacks": [handler]})
    assert isinstance(message, AIMessage)
    (sample,) = samples_of(collector)
    assert sample.call_ids == [call_id_of(message)]
    assert message.response_metadata["tito"]["episode_id"] == sample.episode_id


async def test_a_plain_openai_client_in_a_node_joins_the_episode(
    collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """A node calling a collector.wrap()-ed openai client is attributed from the runnable config:
    the graph's episode, the node as agent."""
    client = collector.wrap(openai.AsyncOpenAI(base_url=fake_server.base_url, api_key="EMPTY"))

    async def raw(state: MessagesState) -> dict[str, Any]:
        await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Hi!"}], max_tokens=8
        )
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("raw", raw)
    graph.add_edge(START, "raw")
    handler = TitoCallbackHandler(collector)
    await graph.compile().ainvoke(
        QUESTION, config={"callbacks": [handler], "metadata": {"episode_id": "e"}}
    )
    await client.close()
    (sample,) = samples_of(collector)
    assert (sample.episode_id, sample.agent) == ("e", "raw")
    assert "lc_run_id" not in sample.metadata["labels"]


async def test_a_failing_reward_fn_or_capture_never_fails_the_run(
    make_model: MakeModel, collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """A reward_fn that raises writes the episode as failed; a call without token ids makes the
    episode's capture error land on handler.errors; the user's runs still succeed."""

    def broken(outputs: Any) -> float:
        raise ValueError("no score")

    handler = TitoCallbackHandler(collector, broken)
    llm = wrap(make_model(), collector)
    await llm.ainvoke("Hello.", config={"callbacks": [handler]})
    assert samples_of(collector) == [] and isinstance(handler.errors[-1], ValueError)

    handler = TitoCallbackHandler(collector)
    fake_server.faults.no_token_ids = True
    await llm.ainvoke("Hello.", config={"callbacks": [handler]})
    assert isinstance(handler.errors[-1], tito.EpisodeCaptureError)
    assert samples_of(collector) == [] and collector.stats.unusable_calls == 1


async def test_finish_pending_writes_what_awaits_a_reward(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """finish_pending() writes every episode still awaiting its reward, with the rewards so far."""
    handler = TitoCallbackHandler(collector, await_reward=True)
    llm = wrap(make_model(), collector)
    for _ in range(2):
        await llm.ainvoke("Hello.", config={"callbacks": [handler]})
    assert samples_of(collector) == [] and handler.finish_pending() == 2
    assert [s.reward for s in samples_of(collector)] == [None, None]
