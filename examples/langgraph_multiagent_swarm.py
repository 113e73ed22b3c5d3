"""A swarm of two agents that hand the conversation to each other, N conversations at once,
captured by tito-agents.

    python examples/langgraph_multiagent_swarm.py --base-url http://127.0.0.1:8765/v1 --episodes 8

langgraph-swarm's README example on `langchain.agents.create_agent`: Alice (an addition expert) and
Bob (who speaks like a pirate) hand off with `create_handoff_tool`; each conversation has two turns
on one thread ("I'd like to speak to Bob", then a sum, which Bob hands back to Alice). tito-agents
adds the lines marked `# tito-agents`: the import, a `TitoCallbackHandler` (one episode per turn,
rewarded by `score`), the model wrapped so that its calls capture, and the handler on the swarm.
Every model call becomes a sample with the exact token ids vLLM sampled, labelled with the agent
that made it (`Alice`, `Bob`) and its `agent_path`; the turn's `thread_id` is on its labels.

`build_swarm(model, middleware=...)` adds middleware to both agents: the end-to-end test steers a
135M model through the handoffs with it (forced tool choice); a capable model needs none.
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
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph_swarm import create_handoff_tool, create_swarm
from pydantic import SecretStr
from tito_agents_langchain import Collector, TitoCallbackHandler, wrap  # tito-agents

SUMS = [(5, 7), (12, 30), (8, 9), (21, 21)]


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def build_swarm(
    model: ChatOpenAI, middleware: Sequence[AgentMiddleware[Any, Any]] = ()
) -> CompiledStateGraph[Any]:
    alice = create_agent(
        model,
        [add, create_handoff_tool(agent_name="Bob", description="Transfer to Bob")],
        system_prompt="You are Alice, an addition expert.",
        middleware=middleware,
        name="Alice",
    )
    bob = create_agent(
        model,
        [
            create_handoff_tool(
                agent_name="Alice", description="Transfer to Alice, she can help with math"
            )
        ],
        system_prompt="You are Bob, you speak like a pirate.",
        middleware=middleware,
        name="Bob",
    )
    workflow = create_swarm([alice, bob], default_active_agent="Alice")
    return workflow.compile(checkpointer=InMemorySaver())


def score(result: dict[str, Any]) -> float:
    """1.0 when the last answer of a sum turn holds the sum (a greeting turn scores 1.0)."""
    asked = next((str(m.content) for m in reversed(result["messages"]) if m.type == "human"), "")
    sums = [a + b for a, b in SUMS if f"{a} + {b}" in asked]
    return 1.0 if not sums or str(sums[0]) in str(result["messages"][-1].content) else 0.0


async def run_conversation(app: CompiledStateGraph[Any], index: int) -> dict[str, Any]:
    """Two turns on one thread: ask for Bob, then ask a sum (Bob hands it to Alice)."""
    a, b = SUMS[index % len(SUMS)]
    result: dict[str, Any] = {}
    for turn, text in enumerate(("i'd like to speak to Bob", f"what's {a} + {b}?")):
        config: RunnableConfig = {
            "configurable": {"thread_id": f"conversation-{index}"},
            "metadata": {"episode_id": f"swarm-{index}-turn-{turn}", "task_id": f"{a}+{b}"},
            "recursion_limit": 16,
        }
        task = {"messages": [{"role": "user", "content": text}]}
        result = await app.ainvoke(task, config=config)
    return result


def first_model(base_url: str) -> str:
    with openai.OpenAI(base_url=base_url, api_key="EMPTY") as client:
        return client.models.list().data[0].id


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--episodes", type=int, default=4, help="conversations (two turns each)")
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
    app = build_swarm(model).with_config(callbacks=[tito])  # tito-agents

    started = time.time()
    outcomes = await asyncio.gather(
        *(run_conversation(app, i) for i in range(args.episodes)), return_exceptions=True
    )
    results = [r for r in outcomes if not isinstance(r, BaseException)]
    crashed = len(outcomes) - len(results)
    scores = [score(r) for r in results] + [0.0] * crashed
    print(f"{len(outcomes)} conversations in {time.time() - started:.0f}s ({crashed} crashed)")
    print(f"mean score      {sum(scores) / len(scores):.2f}")

    tito.collector.close()  # flushes the file; the counters below are for reporting only
    stats = tito.collector.stats
    print(f"calls           {stats.complete_calls} complete, {stats.incomplete_calls} incomplete")
    print(f"samples         {stats.samples} ({stats.trained_tokens} of {stats.tokens} tokens)")
    print(f"file            {args.out.resolve()}")
    return 0 if stats.samples else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
