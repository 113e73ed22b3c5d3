"""Multi-agent triage on the OpenAI Agents SDK: N episodes at once, exact samples per agent.

    python examples/agents_sdk_triage.py --base-url http://127.0.0.1:8765/v1 --episodes 4 \
        --out agents-samples.jsonl

A triage agent hands off to a billing or a weather specialist; each specialist calls its tool, then
answers. The agents are plain Agents SDK code, on the SDK's default model (`OpenAIResponsesModel`,
the Responses API; `--api chat_completions` for Chat Completions), naming no model. tito-agents adds
one line, `install(...)` (capture, the served model for agents that name none, every call labelled
with its agent), and `collector.episode(...)` around each run. Rewards are given after the run,
per agent: triage for routing to the right specialist, the specialist for an answer that uses its
tool's result. Each agent's calls are then merged into
its own trajectories (`tito_agents.assembly.merged`) and written to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import tito_agents_openai_agents as tito_oa
from agents import Agent, AgentsException, ModelSettings, RunConfig, Runner, function_tool

import tito_agents as tito
from tito_agents.assembly import EpisodeContext, assemble_merged

INVOICES = {"INV-1042": "paid on May 2", "INV-2077": "overdue by 12 days", "INV-3001": "refunded"}
WEATHER = {"Paris": "18C and sunny", "Oslo": "3C and snowing", "Lima": "25C and clear"}


@function_tool
def get_invoice(invoice_id: str) -> str:
    """Look up the status of an invoice by its id (like INV-1042)."""
    return INVOICES.get(invoice_id.strip().upper(), "no such invoice")


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return WEATHER.get(city.strip().title(), "unknown")


@dataclass(frozen=True)
class Task:
    question: str
    specialist: str
    fact: str
    """A word the specialist's answer must contain (from its tool's result)."""


BILLING_TASKS = [
    Task(f"What is the status of invoice {i}?", "billing", s.split()[0])
    for i, s in INVOICES.items()
]
WEATHER_TASKS = [
    Task(f"What is the weather in {c} right now?", "weather", w.split()[0])
    for c, w in WEATHER.items()
]
TASKS = [task for pair in zip(BILLING_TASKS, WEATHER_TASKS, strict=True) for task in pair]


def build_agents(max_tokens: int) -> Agent[Any]:
    """The triage agent and its two specialists, naming no model (as upstream's examples do).
    `tool_choice="required"` makes each agent's first call a tool call (the SDK resets it to "auto"
    once the agent has used a tool)."""
    first_tool = ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=1.0)
    billing = Agent(
        name="billing",
        instructions="You answer billing questions. Look the invoice up, then answer briefly.",
        tools=[get_invoice],
        model_settings=first_tool,
    )
    weather = Agent(
        name="weather",
        instructions="You answer weather questions. Look the weather up, then answer briefly.",
        tools=[get_weather],
        model_settings=first_tool,
    )
    return Agent(
        name="triage",
        instructions="Hand billing and invoice questions to billing, weather questions to weather.",
        handoffs=[billing, weather],
        model_settings=first_tool,
    )


async def run_episode(
    capture: tito_oa.AgentsCapture, triage: Agent[Any], task: Task, index: int
) -> tuple[tito.Episode, bool, bool]:
    """One rollout; rewards after the run: triage for routing, the specialist for its answer."""
    collector = capture.collector
    # A seed per episode makes runs repeatable (the run config is the user's own; install's runner
    # adds tito's agent labels to it and gives agents that name no model the served model).
    config = RunConfig(model_settings=ModelSettings(extra_body={"seed": index}))
    routed = answered = False
    try:
        async with collector.episode(
            task_id=f"task-{index % len(TASKS)}", group_id=task.specialist
        ) as ep:
            try:
                result = await Runner.run(triage, task.question, max_turns=6, run_config=config)
                routed = result.last_agent.name == task.specialist
                answered = routed and task.fact.lower() in str(result.final_output).lower()
            except AgentsException as exc:  # a small model can loop or emit a bad tool call
                print(f"\n  run {index}: {type(exc).__name__}: {exc}", file=sys.stderr)
            # Merged samples add a call's own reward to the episode's: triage's trajectory gets
            # routing + outcome, the specialists' trajectories the outcome.
            tito_oa.set_agent_reward(ep, "triage", 1.0 if routed else 0.0)
            ep.set_reward(1.0 if answered else 0.0)
    except tito.EpisodeCaptureError as exc:  # good calls were still captured
        print(f"\n  capture problem: {exc}", file=sys.stderr)
    return ep, routed, answered


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument(
        "--api",
        choices=["responses", "chat_completions"],
        default="responses",
        help="the OpenAI API the agents' models call (default: the SDK's own, Responses)",
    )
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("agents-samples.jsonl"))
    args = parser.parse_args()

    # The per-call samples the collector assembles are not kept: this example writes each agent's
    # merged trajectories itself, from the episode's calls.
    collector = tito.Collector(tito.sinks.CallbackSink(lambda samples: None), capture_logprobs=True)
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="EMPTY", timeout=600)
    # tito-agents, the one line: capture, the served model for agents that name none, every call
    # labelled with its agent (from the SDK's tracing spans); no trace upload to OpenAI.
    capture = tito_oa.install(collector, client, model=args.model, api=args.api)
    # The SDK fails a Responses call cut by max_output_tokens: leave a small model room to finish.
    triage = build_agents(160 if args.api == "responses" else 64)
    args.out.unlink(missing_ok=True)

    print(f"running {args.episodes} episodes against {args.base_url} ({args.api})", file=sys.stderr)
    started = time.time()
    results = await asyncio.gather(
        *(run_episode(capture, triage, TASKS[i % len(TASKS)], i) for i in range(args.episodes))
    )
    elapsed = time.time() - started

    samples: list[tito.Sample] = []
    divergences: Counter[str] = Counter()
    with tito.sinks.JsonlSink(args.out) as sink:
        for ep, _, _ in results:
            context = EpisodeContext(ep.episode_id, ep.reward, ep.task_id, ep.group_id)
            merged, breaks = assemble_merged(ep.calls, context)
            sink.write(merged)
            samples.extend(merged)
            divergences.update(b.kind.value for b in breaks)
    await client.close()
    collector.close()

    stats = collector.stats
    calls_per_agent = Counter(c.agent for ep, _, _ in results for c in ep.calls)
    print("\n== tito-agents x OpenAI Agents SDK: triage ==")
    print(
        f"episodes        {len(results)} in {elapsed:.0f}s  (routed right "
        f"{sum(r for _, r, _ in results)}, answered {sum(a for _, _, a in results)})"
    )
    print(
        f"calls           {stats.complete_calls} complete, {stats.unusable_calls} unusable, "
        f"{stats.incomplete_calls} incomplete; per agent "
        + ", ".join(f"{a} {n}" for a, n in sorted(calls_per_agent.items(), key=str))
    )
    for agent in sorted({s.agent for s in samples}, key=str):
        mine = [s for s in samples if s.agent == agent]
        print(
            f"  {agent!s:<13} {len(mine)} trajectories, {sum(s.num_trained for s in mine)} "
            f"trained of {sum(s.num_tokens for s in mine)} tokens"
        )
    print(f"divergences     {dict(divergences) or 'none'}")
    print(f"uncaptured      {capture.stats.uncaptured_calls} model calls")
    print(f"file            {args.out.resolve()}  ({len(samples)} samples)")
    return 0 if samples and not capture.stats.uncaptured_calls else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
