"""Multi-agent graphs as users build them, 8 concurrent runs each, on the fake vLLM with a model
that takes handoffs (`handoff_responder`): every call captured, in its run's episode, labelled with
the agent LangGraph itself says made it, and merged samples one per agent per trajectory.

The reference is the framework's own trace (lc_multiagent.py: LangGraph's stream with subgraphs,
the node and `AIMessage.name` of every model message). Patterns: langgraph-supervisor
(`create_supervisor`), the supervisor with experts as tools
(examples/langgraph_multiagent_supervisor.py), langgraph-swarm handoffs
(examples/langgraph_multiagent_swarm.py), hierarchical teams, and `Send` fan-out.
"""

from __future__ import annotations

import importlib.util
import operator
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send
from langgraph_supervisor import create_supervisor
from lc_multiagent import run_concurrently
from lc_support import MakeModel, responder
from tito_agents_langchain import wrap

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

RUNS = 8
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"tito_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chat_requests(server: FakeVLLMServer) -> Callable[[], int]:
    return lambda: server.stats.requests["/v1/chat/completions"]


@pytest.fixture(scope="module")
def fake_server() -> Any:
    """A canonical fake (re-encoding its output gives the same ids), so that a merged sample
    splits only where the graph itself breaks an agent's history, never on injected drift."""
    with FakeVLLMServer(FakeConfig(tokenization="canonical", responder=responder)) as server:
        yield server


@pytest.fixture
def merged_collector() -> Any:
    with tito.Collector(assembly="merged") as collector:
        yield collector


def experts(model: ChatOpenAI) -> list[CompiledStateGraph[Any]]:
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    def web_search(query: str) -> str:
        """Search the web for information."""
        return "Hamlet was written by William Shakespeare."

    return [
        create_agent(model, [add], system_prompt="You are a math expert.", name="math_expert"),
        create_agent(
            model, [web_search], system_prompt="You are a researcher.", name="research_expert"
        ),
    ]


def task(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def turn(text: str, episode_id: str, **config: Any) -> tuple[dict[str, Any], RunnableConfig]:
    return task(text), {"metadata": {"episode_id": episode_id}, "recursion_limit": 40, **config}


# langgraph-supervisor 0.0.31 builds its supervisor with LangGraph's deprecated create_react_agent.
upstream_deprecation = pytest.mark.filterwarnings(
    "ignore:create_react_agent has been moved:DeprecationWarning"
)

ASK_BOTH = "What is 3 plus 4, and who wrote Hamlet? Ask the math_expert and the research_expert."


@upstream_deprecation
async def test_langgraph_supervisor(
    make_model: MakeModel, merged_collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """create_supervisor: the supervisor (a create_react_agent named `supervisor`) hands off to
    both experts in turn; each expert is its own agent and its own merged trajectory."""
    model = wrap(make_model(), merged_collector)
    app = create_supervisor(experts(model), model=model, prompt="Route the work.").compile()
    runs = [(app, [turn(ASK_BOTH, f"sup-{i}")]) for i in range(RUNS)]
    outcome = await run_concurrently(merged_collector, runs, chat_requests(fake_server))
    assert (outcome.lost, outcome.wrong_episode, outcome.wrong_agent) == (0, 0, 0)
    assert outcome.paths == {
        "supervisor": {"supervisor"},
        "math_expert": {"math_expert"},
        "research_expert": {"research_expert"},
    }
    # supervisor: route, route, answer; each expert: its tool, its answer
    assert set(outcome.calls.values()) <= {2, 3} and len(outcome.calls) == 3 * RUNS
    assert outcome.merged == Counter({key: 1 for key in outcome.calls})


async def test_supervisor_with_experts_as_tools_example(
    make_model: MakeModel, merged_collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """The example's supervisor (create_agent) calls experts run inside its tools: the experts'
    calls carry the path `supervisor>expert`."""
    example = load_example("langgraph_multiagent_supervisor")
    app = example.build_supervisor(wrap(make_model(), merged_collector))
    runs = [(app, [turn(ASK_BOTH, f"tools-{i}")]) for i in range(RUNS)]
    outcome = await run_concurrently(merged_collector, runs, chat_requests(fake_server))
    assert (outcome.lost, outcome.wrong_episode, outcome.wrong_agent) == (0, 0, 0)
    assert outcome.paths == {
        "supervisor": {"supervisor"},
        "math_expert": {"supervisor>math_expert"},
        "research_expert": {"supervisor>research_expert"},
    }
    assert len(outcome.calls) == 3 * RUNS
    assert outcome.merged == Counter({key: 1 for key in outcome.calls})


async def test_swarm_handoffs_example(
    make_model: MakeModel, merged_collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """The example's swarm, two turns on one thread: Alice hands off to Bob, then Bob back to
    Alice, who uses her tool; each turn is an episode with one merged sample per agent."""
    example = load_example("langgraph_multiagent_swarm")
    runs = []
    for i in range(RUNS):
        app = example.build_swarm(wrap(make_model(), merged_collector))
        thread = {"configurable": {"thread_id": f"t-{i}"}}
        turns = [
            turn("i'd like to speak to Bob", f"swarm-{i}-0", **thread),
            turn("what's 5 + 7?", f"swarm-{i}-1", **thread),
        ]
        runs.append((app, turns))
    outcome = await run_concurrently(merged_collector, runs, chat_requests(fake_server))
    assert (outcome.lost, outcome.wrong_episode, outcome.wrong_agent) == (0, 0, 0)
    assert outcome.paths == {"Alice": {"Alice"}, "Bob": {"Bob"}}
    for i in range(RUNS):  # turn 0: Alice hands off, Bob answers; turn 1: Bob, then Alice x2
        assert outcome.calls[(f"swarm-{i}-0", "Alice")] == outcome.calls[(f"swarm-{i}-0", "Bob")]
        assert outcome.calls[(f"swarm-{i}-1", "Alice")] == 2
    assert outcome.merged == Counter({key: 1 for key in outcome.calls})


@upstream_deprecation
async def test_hierarchical_teams(
    make_model: MakeModel, merged_collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """Nested create_supervisor teams: the team's own supervisor and experts are agents of their
    own, their path names the team."""
    model = wrap(make_model(), merged_collector)
    research_team = create_supervisor(
        experts(model), model=model, supervisor_name="research_supervisor"
    ).compile(name="research_team")
    writer = create_agent(model, [], system_prompt="You write.", name="writer")
    writing_team = create_supervisor(
        [writer], model=model, supervisor_name="writing_supervisor"
    ).compile(name="writing_team")
    app = create_supervisor(
        [research_team, writing_team], model=model, supervisor_name="top_supervisor"
    ).compile()
    text = f"{ASK_BOTH} The research_team first, then the writing_team asks the writer."
    runs = [(app, [turn(text, f"teams-{i}")]) for i in range(RUNS)]
    outcome = await run_concurrently(merged_collector, runs, chat_requests(fake_server))
    assert (outcome.lost, outcome.wrong_episode, outcome.wrong_agent) == (0, 0, 0)
    assert outcome.paths == {
        "top_supervisor": {"top_supervisor"},
        "research_supervisor": {"research_team>research_supervisor"},
        "math_expert": {"research_team>math_expert"},
        "research_expert": {"research_team>research_expert"},
        "writing_supervisor": {"writing_team>writing_supervisor"},
        "writer": {"writing_team>writer"},
    }
    assert outcome.merged == Counter({key: 1 for key in outcome.calls})


class FanOut(TypedDict):
    topics: list[str]
    messages: Annotated[list[BaseMessage], operator.add]


async def test_send_fan_out(
    make_model: MakeModel, merged_collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """`Send` fans one node out to parallel tasks and to an agent subgraph: each task's call is
    its node's (or the agent's), and each parallel call is a trajectory of its own."""
    model = wrap(make_model(), merged_collector)
    summarizer = create_agent(model, [], system_prompt="Summarize.", name="summarizer")

    async def worker(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(f"Write one line about {state['topic']}.")]}

    def fan_out(state: FanOut) -> list[Send]:
        sends = [Send("worker", {"topic": t}) for t in state["topics"]]
        return [*sends, Send("summarizer", {"messages": [("user", "Summarize the topics.")]})]

    graph = StateGraph(FanOut)
    graph.add_node("worker", worker)
    graph.add_node("summarizer", summarizer)
    graph.add_conditional_edges(START, fan_out, ["worker", "summarizer"])
    app = graph.compile()
    topics = ["Oslo", "Lima", "Quito"]
    runs = [
        (app, [({"topics": topics, "messages": []}, turn("", f"fan-{i}")[1])]) for i in range(RUNS)
    ]
    outcome = await run_concurrently(merged_collector, runs, chat_requests(fake_server))
    assert (outcome.lost, outcome.wrong_episode, outcome.wrong_agent) == (0, 0, 0)
    assert outcome.paths == {"worker": {"worker"}, "summarizer": {"summarizer"}}
    for i in range(RUNS):
        assert outcome.calls[(f"fan-{i}", "worker")] == len(topics)
        assert outcome.merged[(f"fan-{i}", "worker")] == len(topics)  # parallel: not one chain
        assert outcome.merged[(f"fan-{i}", "summarizer")] == 1


@pytest.mark.parametrize(
    ("name", "agents"),
    [
        ("langgraph_multiagent_supervisor", {"supervisor", "math_expert", "research_expert"}),
        ("langgraph_multiagent_swarm", {"Alice", "Bob"}),
    ],
)
def test_examples_run_as_programs(
    name: str, agents: set[str], fake_server: FakeVLLMServer, tmp_path: Path
) -> None:
    """Each example runs as the docs say and writes merged samples, one per agent and episode."""
    out = tmp_path / "samples.jsonl"
    command = [sys.executable, str(EXAMPLES / f"{name}.py"), "--base-url", fake_server.base_url]
    options = ["--episodes", "2", "--assembly", "merged", "--out", str(out)]
    run = subprocess.run([*command, *options], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    samples = list(tito.read_samples(out))
    assert {s.agent for s in samples} == agents
    per_agent = Counter((s.episode_id, s.agent) for s in samples)
    assert set(per_agent.values()) == {1}
