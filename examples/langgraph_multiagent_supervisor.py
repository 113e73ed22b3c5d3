"""A supervisor with two expert agents, N tasks at once, captured by tito-agents.

    python examples/langgraph_multiagent_supervisor.py --base-url http://127.0.0.1:8765/v1 --episodes 8

LangChain's supervisor pattern as its multi-agent guide builds it: two experts made with
`langchain.agents.create_agent`, each wrapped in a tool, and a supervisor agent that calls those
tools. tito-agents adds the lines marked `# tito-agents`: the import, a `TitoCallbackHandler` (one
episode per task, rewarded by `score`), the model wrapped so that its calls capture, and the handler
on the supervisor. Every model call becomes a sample with the exact token ids vLLM sampled, labelled
with the agent that made it (`supervisor`, `math_expert`, `research_expert`) and the chain of agents
around it (`metadata["labels"]["agent_path"]`, e.g. `supervisor>math_expert`); with
`--assembly merged` each agent's calls of a task form one sample.

`build_supervisor(model, middleware=...)` adds middleware to every agent: the end-to-end test steers
a 135M model through the tools with it (forced tool choice); a capable model needs none.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph.state import CompiledStateGraph
from pydantic import SecretStr
from tito_agents_langchain import Collector, TitoCallbackHandler, wrap  # tito-agents

AUTHORS = {
    "Hamlet": "William Shakespeare",
    "Dracula": "Bram Stoker",
    "Emma": "Jane Austen",
    "Ulysses": "James Joyce",
}
TASKS = [(12, 7, "Hamlet"), (9, 8, "Dracula"), (6, 11, "Emma"), (13, 3, "Ulysses")]


def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


def web_search(query: str) -> str:
    """Search the web for information."""
    found = [f"{work} was written by {who}." for work, who in AUTHORS.items() if work in query]
    return " ".join(found) or "No results."


def build_supervisor(
    model: ChatOpenAI, middleware: Sequence[AgentMiddleware[Any, Any]] = ()
) -> CompiledStateGraph[Any]:
    """Two experts, each a tool of the supervisor (the tool runs the expert on the request)."""
    math_agent = create_agent(
        model,
        tools=[multiply, add],
        system_prompt="You are a math expert. Always use one tool at a time.",
        middleware=middleware,
        name="math_expert",
    )
    research_agent = create_agent(
        model,
        tools=[web_search],
        system_prompt="You are a world class researcher with access to web search. No math.",
        middleware=middleware,
        name="research_expert",
    )

    @tool
    async def math_expert(request: str) -> str:
        """Ask the math expert to compute something (multiplication, addition)."""
        result = await math_agent.ainvoke({"messages": [{"role": "user", "content": request}]})
        return str(result["messages"][-1].content)

    @tool
    async def research_expert(request: str) -> str:
        """Ask the research expert to look facts up on the web (who wrote a book, ...)."""
        result = await research_agent.ainvoke({"messages": [{"role": "user", "content": request}]})
        return str(result["messages"][-1].content)

    return create_agent(
        model,
        tools=[math_expert, research_expert],
        system_prompt=(
            "You are a team supervisor managing a math expert and a research expert. For math, "
            "ask math_expert. For facts, ask research_expert. Then answer the user."
        ),
        middleware=middleware,
        name="supervisor",
    )


def question(a: int, b: int, work: str) -> str:
    return (
        f"What is {a} times {b}, and who wrote {work}? Ask the math_expert and the research_expert."
    )


def score(result: dict[str, Any]) -> float:
    """0.5 for the product in the final answer, 0.5 for the author's surname."""
    asked = str(result["messages"][0].content)
    answer = str(result["messages"][-1].content)
    a, b, work = next(t for t in TASKS if question(*t) == asked)
    product = 0.5 if str(a * b) in answer else 0.0
    return product + (0.5 if AUTHORS[work].split()[-1] in answer else 0.0)


async def run_episode(app: CompiledStateGraph[Any], index: int) -> dict[str, Any]:
    """One task: a product and an author, so the supervisor needs both experts."""
    a, b, work = TASKS[index % len(TASKS)]
    config: RunnableConfig = {
        "metadata": {"episode_id": f"supervisor-{index}", "task_id": f"{a}x{b}-{work}"},
        "recursion_limit": 24,
    }
    task = {"messages": [{"role": "user", "content": question(a, b, work)}]}
    return await app.ainvoke(task, config=config)


def first_model(base_url: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key="EMPTY") as client:
        return client.models.list().data[0].id


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--assembly", choices=["per_call", "merged", "both"], default="per_call")
    parser.add_argument("--out", type=Path, default=Path("samples.jsonl"))
    return parser.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    model = ChatOpenAI(
        model=args.model or first_model(args.base_url),
        base_url=args.base_url,
        api_key=SecretStr("EMPTY"),
        max_completion_tokens=96,
        timeout=600,
    )
    tito = TitoCallbackHandler(Collector(args.out, assembly=args.assembly), score)  # tito-agents
    model = wrap(model, tito.collector)  # tito-agents
    app = build_supervisor(model).with_config(callbacks=[tito])  # tito-agents

    started = time.time()
    outcomes = await asyncio.gather(
        *(run_episode(app, i) for i in range(args.episodes)), return_exceptions=True
    )
    results = [r for r in outcomes if not isinstance(r, BaseException)]
    crashed = len(outcomes) - len(results)
    scores = [score(r) for r in results] + [0.0] * crashed
    print(f"{len(outcomes)} episodes in {time.time() - started:.0f}s ({crashed} crashed)")
    print(f"mean score      {sum(scores) / len(scores):.2f}")

    tito.collector.close()  # flushes the file; the counters below are for reporting only
    stats = tito.collector.stats
    print(f"calls           {stats.complete_calls} complete, {stats.incomplete_calls} incomplete")
    print(f"samples         {stats.samples} ({stats.trained_tokens} of {stats.tokens} tokens)")
    print(f"file            {args.out.resolve()}")
    return 0 if stats.samples else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
