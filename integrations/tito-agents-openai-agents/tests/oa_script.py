"""A scripted multi-agent workflow for the fake vLLM: who says what is decided by the prompt alone.

Every agent's instructions start with "ROLE: <agent name>", and every run's input carries a
"case-<n>" marker, so each captured call can be checked by content: its agent label must be the
role in its system prompt, and its prompt must carry its own episode's case.

* triage hands off (tool `transfer_to_billing` / `transfer_to_weather`) by the words of the input;
* billing / weather call their tool once, then answer with its result;
* manager calls its `translate` tool (the translator agent run as a tool), then answers;
* translator answers at once.

Each run makes three model calls: triage, specialist, specialist; or manager, translator, manager.

Two more upstream patterns (openai-agents-python's examples/agent_patterns), on agents that name no
model (the one-line install gives them the served one):

* parallelization: spanish translates (three runs at once), picker picks the best;
* streamed routing: router hands off by language (`transfer_to_french` when the input says
  "bonjour", else `transfer_to_english`); french / english answer; the next turn starts at the
  agent the first ended on.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
from agents import Agent, Model, function_tool

from tito_agents import Call
from tito_agents.testing.fake_vllm import FakeVLLMServer, RequestView, hermes_tool_call
from tito_agents.testing.smollm2 import load_tokenizer

_ROLE = re.compile(r"ROLE: (\w+)")
_CASE = re.compile(r"case-\d+")
CALLS_PER_RUN = 3


@function_tool
def get_invoice(invoice_id: str) -> str:
    """Look up an invoice by its id."""
    return f"invoice {invoice_id} is paid"


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


@dataclass(frozen=True)
class Agents:
    triage: Agent[Any]
    billing: Agent[Any]
    weather: Agent[Any]
    manager: Agent[Any]
    translator: Agent[Any]


def build_agents(model: str | Model) -> Agents:
    """The five agents of the script, all on `model`."""
    billing = Agent(
        name="billing",
        instructions="ROLE: billing. Look up the invoice, then answer.",
        tools=[get_invoice],
        model=model,
    )
    weather = Agent(
        name="weather",
        instructions="ROLE: weather. Look up the weather, then answer.",
        tools=[get_weather],
        model=model,
    )
    triage = Agent(
        name="triage",
        instructions="ROLE: triage. Hand off to the right specialist.",
        handoffs=[billing, weather],
        model=model,
    )
    translator = Agent(
        name="translator", instructions="ROLE: translator. Translate to French.", model=model
    )
    manager = Agent(
        name="manager",
        instructions="ROLE: manager. Use the translate tool, then answer.",
        tools=[translator.as_tool(tool_name="translate", tool_description="Translate to French.")],
        model=model,
    )
    return Agents(triage, billing, weather, manager, translator)


@dataclass(frozen=True)
class MoreAgents:
    spanish: Agent[Any]
    picker: Agent[Any]
    router: Agent[Any]


def build_more_agents(model: str | Model | None = None) -> MoreAgents:
    """The parallelization and routing agents (no model by default, as upstream writes them)."""
    spanish = Agent(
        name="spanish", instructions="ROLE: spanish. Translate to Spanish.", model=model
    )
    picker = Agent(name="picker", instructions="ROLE: picker. Pick the best one.", model=model)
    french = Agent(name="french", instructions="ROLE: french. You only speak French.", model=model)
    english = Agent(
        name="english", instructions="ROLE: english. You only speak English.", model=model
    )
    router = Agent(
        name="router",
        instructions="ROLE: router. Hand off by the language of the request.",
        handoffs=[french, english],
        model=model,
    )
    return MoreAgents(spanish, picker, router)


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def role_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The role named by the system prompt ("?" when there is none)."""
    for message in messages:
        if message.get("role") == "system":
            found = _ROLE.search(_text(message))
            return found.group(1) if found else "?"
    return "?"


def case_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """The first "case-<n>" marker in the user turns."""
    for message in messages:
        if message.get("role") == "user" and (found := _CASE.search(_text(message))):
            return found.group(0)
    return "case-?"


def _called_tools(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    return {
        str(tc.get("function", {}).get("name"))
        for m in messages
        if m.get("role") == "assistant"
        for tc in m.get("tool_calls") or ()
    }


def responder(view: RequestView) -> str:
    """What the scripted model says, from the request's messages only."""
    messages = view.messages
    role, case = role_of(messages), case_of(messages)
    called = _called_tools(messages)
    user = " ".join(_text(m) for m in messages if m.get("role") == "user")
    if role == "triage":
        target = "billing" if "invoice" in user else "weather"
        return hermes_tool_call(f"transfer_to_{target}", {})
    if role == "billing":
        if "get_invoice" not in called:
            return hermes_tool_call("get_invoice", {"invoice_id": case})
        return f"[billing] {case}: your invoice is paid."
    if role == "weather":
        if "get_weather" not in called:
            return hermes_tool_call("get_weather", {"city": case})
        return f"[weather] {case}: it is sunny."
    if role == "manager":
        if "translate" not in called:
            return hermes_tool_call("translate", {"input": f"hello from {case}"})
        return f"[manager] {case}: translated."
    if role == "translator":
        return f"[translator] {case}: bonjour."
    if role == "router":
        return hermes_tool_call(
            "transfer_to_french" if "bonjour" in user else "transfer_to_english", {}
        )
    if role in ("spanish", "picker", "french", "english"):
        turns = sum(1 for m in messages if m.get("role") == "user")
        return f"[{role}] {case}: turn {turns}."
    return json.dumps({"unexpected": role})


@functools.cache
def _tokenizer() -> Any:
    return load_tokenizer()


def prompt_text(call: Call) -> str:
    """The prompt the server rendered for a call, decoded from its captured ids (the same for the
    Responses and Chat Completions APIs, which keep no messages on Responses calls)."""
    return str(_tokenizer().decode(call.prompt_ids.tolist()))


def misattributed(call: Call, expected_case: str) -> list[str]:
    """What is wrong with a call's attribution, judged by its prompt ([] when nothing is): the
    role in its system prompt and the case of its first user turn, read from the ids."""
    text = prompt_text(call)
    role = _ROLE.search(text)
    case = _CASE.search(text)
    problems = []
    if role is None or call.agent != role.group(1):
        problems.append(f"{call.call_id}: agent {call.agent!r} but prompt of {role}")
    if case is None or case.group(0) != expected_case:
        problems.append(f"{call.call_id}: {case} in episode of {expected_case}")
    return problems


def new_client(server: FakeVLLMServer, **kwargs: object) -> openai.AsyncOpenAI:
    limits = __import__("httpx2").Limits(max_connections=256)
    return openai.AsyncOpenAI(
        base_url=server.base_url,
        api_key="EMPTY",
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
        **kwargs,  # type: ignore[arg-type]
    )
