"""A LangGraph ReAct agent with a weather tool, N episodes at once, captured by tito-agents.

    python examples/langgraph_agent.py --base-url http://127.0.0.1:8765/v1 --episodes 8 --out samples.jsonl

The agent is ordinary LangGraph code: a model node that calls tools, a ToolNode that runs them, and
the loop between the two. tito-agents adds the three lines marked `# tito-agents`: the import, a
`TitoCallbackHandler` (one episode per graph invocation, rewarded by the agent's own `score`), and
the graph line, which wraps the model and attaches the handler. Every model call becomes a sample
with the exact token ids vLLM sampled and their logprobs, labelled with its graph node and step.
An episode whose graph raised writes no samples. The forced tool call is decoded under vLLM's
tool-call grammar, so its rollout logprobs are those of the masked distribution (its ids are exact).
The summary at the end reads the collector's counters and closes it (flushing the file).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import openai
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import SecretStr
from tito_agents_langchain import Collector, TitoCallbackHandler, wrap  # tito-agents

WEATHER = {
    "Paris": "18C and sunny",
    "Tokyo": "22C and cloudy",
    "Oslo": "3C and snowing",
    "Lima": "25C and clear",
    "Cairo": "31C and dry",
    "Quito": "14C and rainy",
}


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return WEATHER.get(city.strip().title(), "unknown")


TOOLS = [get_weather]


def build_agent(llm: ChatOpenAI) -> CompiledStateGraph[Any]:
    """The ReAct loop: agent -> tools -> agent -> end. A 135M model gets one tool round: it must
    call a tool first and must answer once it has seen the result (a larger model would use
    tool_choice="auto" throughout). `strict` makes vLLM hold the forced call to the tool's schema."""
    act = llm.bind_tools(TOOLS, tool_choice="required", strict=True)
    answer = llm.bind_tools(TOOLS, tool_choice="none", strict=True)

    async def agent(state: MessagesState) -> dict[str, Any]:
        observed = any(isinstance(m, ToolMessage) for m in state["messages"])
        model = answer if observed else act
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def score(result: dict[str, Any]) -> float:
    """1.0 when the tool reported a city's weather and the final answer repeats its temperature."""
    observations = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    answer = result["messages"][-1].content
    if not observations or not isinstance(answer, str):
        return 0.0
    observed = str(observations[-1].content)
    if observed not in WEATHER.values():  # a tool error, or an unknown city
        return 0.0
    return 1.0 if observed.split()[0].lower() in answer.lower() else 0.0


async def run_episode(graph: CompiledStateGraph[Any], city: str) -> dict[str, Any]:
    """One rollout: ask for the weather in `city`."""
    question = {
        "messages": [
            SystemMessage("You are a helpful assistant. Use tools when useful."),
            HumanMessage(f"What is the weather in {city} right now?"),
        ]
    }
    config: RunnableConfig = {
        "metadata": {"task_id": f"weather-{city}", "group_id": city},
        "recursion_limit": 8,
    }
    return await graph.ainvoke(question, config=config)


def first_model(base_url: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key="EMPTY") as client:
        return client.models.list().data[0].id


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("samples.jsonl"))
    args = parser.parse_args()

    model = args.model or first_model(args.base_url)
    llm = ChatOpenAI(
        model=model,
        base_url=args.base_url,
        api_key=SecretStr("EMPTY"),
        temperature=1.0,
        max_completion_tokens=64,  # a forced tool call takes 33-40 tokens here
        timeout=600,
    )
    tito = TitoCallbackHandler(Collector(args.out, capture_logprobs=True), score)  # tito-agents
    graph = build_agent(wrap(llm, tito.collector)).with_config(callbacks=[tito])  # tito-agents

    cities = list(WEATHER)
    print(f"running {args.episodes} episodes against {args.base_url} ({model})", file=sys.stderr)
    started = time.time()
    outcomes = await asyncio.gather(
        *(run_episode(graph, cities[i % len(cities)]) for i in range(args.episodes)),
        return_exceptions=True,  # a 135M model's tool call is sometimes beyond parsing
    )
    results = [r for r in outcomes if not isinstance(r, BaseException)]
    crashed = len(outcomes) - len(results)
    scores = [score(r) for r in results] + [0.0] * crashed
    print(f"\n{len(outcomes)} episodes in {time.time() - started:.0f}s ({crashed} crashed)")
    print(f"mean score      {sum(scores) / len(scores):.2f}")

    # What was captured (reporting only: the agent needs none of this).
    tito.collector.close()
    stats = tito.collector.stats
    print(f"calls           {stats.complete_calls} complete, {stats.incomplete_calls} incomplete")
    print(
        f"samples         {stats.samples} ({stats.trained_tokens} of {stats.tokens} tokens trained)"
    )
    print(f"file            {args.out.resolve()}")
    return 0 if stats.samples else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
