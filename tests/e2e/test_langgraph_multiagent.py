"""End-to-end: the LangGraph supervisor and swarm examples on a real CPU vLLM, 8 concurrent runs
each, every call checked against LangGraph's own trace (the node and `AIMessage.name` of each model
message in the run's stream; integrations/tito-agents-langchain/tests/lc_multiagent.py).

A 135M model does not route on its own, so a middleware steers every agent with forced tool choice
(and `strict` tool schemas, so that vLLM's grammar holds the arguments to them),
by the rules of the fake vLLM's `handoff_responder`: call the tools the user names (experts,
handoffs) in turn, then the agent's own first tool, then answer (`tool_choice="none"`). The graphs
are the examples' own (`build_supervisor`, `build_swarm`); only the middleware is added.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import openai
import pytest
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import SecretStr
from tito_agents_langchain import wrap

import tito_agents as tito

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integrations" / "tito-agents-langchain" / "tests"))
from lc_multiagent import Outcome, run_concurrently  # noqa: E402

pytestmark = pytest.mark.e2e

RUNS = 8
HANDOFF = ("transfer_to_", "transfer_back_to_")
_NOT_WORD = re.compile(r"[^a-z0-9]+")


def load_example(name: str) -> ModuleType:
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"tito_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _words(text: str) -> str:
    return f"_{_NOT_WORD.sub('_', text.lower()).strip('_')}_"


def _target(name: str) -> str:
    for prefix in HANDOFF:
        name = name.removeprefix(prefix)
    return _words(name)


class Steer(AgentMiddleware[Any, Any]):
    """Forced tool choice for each model call of every agent (see the module docstring)."""

    def choice(self, request: ModelRequest[Any]) -> str:
        names = [t.name if hasattr(t, "name") else t["function"]["name"] for t in request.tools]
        own = [n for n in names if not n.startswith(HANDOFF)]
        handoffs = [n for n in names if n.startswith(HANDOFF)]
        messages = request.messages
        start = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
        user = str(messages[start].content) if start >= 0 else ""
        called = {
            call["name"]
            for m in messages[start + 1 :]
            if isinstance(m, AIMessage)
            for call in m.tool_calls
        }
        for name in names:
            if name not in called and _target(name) in _words(user):
                return name
        last = messages[-1] if messages else None
        if isinstance(last, ToolMessage) and last.name in own:
            return "none"
        if own and not called.intersection(own):
            return own[0]
        if handoffs and not any(n.startswith(HANDOFF) for n in called):
            return handoffs[0]
        return "none"

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        if not request.tools:
            return await handler(request)
        settings = {**request.model_settings, "strict": True}  # vLLM holds args to the schema
        return await handler(
            request.override(tool_choice=self.choice(request), model_settings=settings)
        )


@pytest.fixture
async def http_client() -> AsyncIterator[openai.DefaultAsyncHttpxClient]:
    """An HTTP client of the test's own event loop (langchain-openai's cached default one would
    outlive it)."""
    async with openai.DefaultAsyncHttpxClient() as client:
        yield client


def model(base_url: str, name: str, collector: tito.Collector, http: Any) -> ChatOpenAI:
    llm = ChatOpenAI(
        model=name,
        base_url=base_url,
        api_key=SecretStr("EMPTY"),
        temperature=0.7,
        max_completion_tokens=48,
        timeout=600,
        http_async_client=http,
    )
    return wrap(llm, collector)


def check(outcome: Outcome) -> None:
    assert (outcome.lost, outcome.wrong_episode, outcome.wrong_agent) == (0, 0, 0)
    # An agent's trajectory may split where vLLM's chat template renders a sampled tool call again
    # differently ("other", "template_rerender"), never because another agent's calls were mixed
    # into it (an expert's turn as a "history_rewrite" of the supervisor's chain).
    assert not {"history_rewrite", "branch"} & set(outcome.starts), outcome.starts


def task(text: str, episode_id: str, **config: Any) -> tuple[dict[str, Any], Any]:
    messages = {"messages": [{"role": "user", "content": text}]}
    return messages, {"metadata": {"episode_id": episode_id}, "recursion_limit": 24, **config}


async def test_supervisor_example_on_real_vllm(
    vllm_base_url: str, vllm_model: str, http_client: Any
) -> None:
    example = load_example("langgraph_multiagent_supervisor")
    with tito.Collector(assembly="merged") as collector:
        app = example.build_supervisor(
            model(vllm_base_url, vllm_model, collector, http_client), middleware=[Steer()]
        )
        runs = [
            (app, [task(example.question(*example.TASKS[i % 4]), f"sup-{i}")]) for i in range(RUNS)
        ]
        outcome = await run_concurrently(collector, runs)
    check(outcome)
    assert outcome.paths == {
        "supervisor": {"supervisor"},
        "math_expert": {"supervisor>math_expert"},
        "research_expert": {"supervisor>research_expert"},
    }
    # A run routes to both experts when the model's forced calls parse; a free-text argument that
    # runs to max tokens does not, and the run goes on (or ends) without that expert.
    assert all(outcome.calls[(f"sup-{i}", "supervisor")] >= 1 for i in range(RUNS))


async def test_swarm_example_on_real_vllm(
    vllm_base_url: str, vllm_model: str, http_client: Any
) -> None:
    example = load_example("langgraph_multiagent_swarm")
    with tito.Collector(assembly="merged") as collector:
        app = example.build_swarm(
            model(vllm_base_url, vllm_model, collector, http_client), middleware=[Steer()]
        )
        runs = []
        for i in range(RUNS):
            thread = {"configurable": {"thread_id": f"t-{i}"}}
            a, b = example.SUMS[i % len(example.SUMS)]
            turns = [
                task("i'd like to speak to Bob", f"swarm-{i}-0", **thread),
                task(f"what's {a} + {b}?", f"swarm-{i}-1", **thread),
            ]
            runs.append((app, turns))
        outcome = await run_concurrently(collector, runs)
    check(outcome)
    assert outcome.paths == {"Alice": {"Alice"}, "Bob": {"Bob"}}
    # Every turn's first call is the active agent's: Alice's in turn 0; Bob's in turn 1 where her
    # forced handoff parsed (the small model's forced calls usually do).
    assert all(outcome.calls[(f"swarm-{i}-0", "Alice")] for i in range(RUNS))
    assert all(
        sum(n for (e, _), n in outcome.calls.items() if e == f"swarm-{i}-1") for i in range(RUNS)
    )
