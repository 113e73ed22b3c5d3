"""Frameworks that build their own model clients, as the export stage names them when an episode
captured fewer calls than were made: which of them the process imported, each one's fix, and
whether a response cache answers repeated prompts without sending a request.

Read from `sys.modules` only: nothing here imports a framework, so naming them costs nothing for a
user who has none of them, and a framework's own attributes are read guarded (a version that
moved them names no cache rather than breaking an episode's end).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DOCS", "FIXES", "FrameworkFix", "fixes_named", "imported_fixes", "response_caches"]

DOCS = "docs/frameworks.md"


@dataclass(frozen=True, slots=True)
class FrameworkFix:
    """How to capture one framework's calls."""

    module: str
    """Its import name, as `sys.modules` holds it once imported."""
    name: str
    fix: str
    """One line: what to give the framework so its calls go through a capturing client."""
    anchor: str
    """The section of docs/frameworks.md that shows it."""

    def line(self) -> str:
        return f"{self.name}: {self.fix} ({DOCS}#{self.anchor})"


FIXES: tuple[FrameworkFix, ...] = (
    FrameworkFix(
        "pydantic_ai",
        "PydanticAI",
        "OpenAIProvider(openai_client=collector.wrap(AsyncOpenAI(...))), and "
        "tito_agents_pydantic_ai.install() for agent names",
        "pydanticai",
    ),
    FrameworkFix(
        "litellm",
        "LiteLLM",
        "`hosted_vllm/` models use LiteLLM's own HTTP client, not an openai one: "
        "tito_agents_litellm.install(collector, vllm_hosts=[...])",
        "litellm",
    ),
    FrameworkFix(
        "dspy",
        "DSPy",
        "its default engine talks raw sockets: dspy.LM(..., engine='litellm', cache=False) with "
        "LiteLLM's fix; its response cache off (cache=False, or for every LM "
        "dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)) so each of a "
        "group's identical prompts reaches the server; tito_agents_dspy.install() for agent names",
        "dspy",
    ),
    FrameworkFix(
        "crewai",
        "CrewAI",
        "one http_client breaks its two clients: tito_agents_crewai.wrap_llm(collector, LLM(...)) "
        "wraps the LLM's own, and tito_agents_crewai.install() names each call's agent role; "
        "or use the gateway",
        "crewai",
    ),
    FrameworkFix(
        "agno",
        "Agno",
        "VLLM(client=collector.wrap(OpenAI(...)), async_client=collector.wrap(AsyncOpenAI(...))), "
        "or http_client=collector.http_client(hosts, library='httpx') (it refuses httpx2 clients), "
        "and tito_agents_agno.install() for agent names",
        "agno",
    ),
    FrameworkFix(
        "strands",
        "Strands",
        "it builds and closes a client per request, so an http_client in client_args captures "
        "one call: OpenAIModel(client=collector.wrap(AsyncOpenAI(...))), and "
        "Agent(..., plugins=[tito_agents_strands.AgentNames()]) for agent names",
        "strands",
    ),
    FrameworkFix(
        "smolagents",
        "smolagents",
        "OpenAIServerModel(client=collector.wrap(OpenAI(...))), and "
        "tito_agents_smolagents.install() for agent names; LiteLLMModel only as LiteLLM's fix says",
        "smolagents",
    ),
    FrameworkFix(
        "google.adk",
        "Google ADK",
        "LiteLlm('openai/<model>', client=collector.wrap(AsyncOpenAI(...))) (hosted_vllm/ as "
        "LiteLLM's fix), and tito_agents_google_adk.install() for agent names",
        "google-adk",
    ),
    FrameworkFix(
        "llama_index",
        "LlamaIndex",
        "OpenAILike(openai_client=collector.wrap(OpenAI(...)), "
        "async_openai_client=collector.wrap(AsyncOpenAI(...))), and "
        "tito_agents_llamaindex.install() for agent names",
        "llamaindex",
    ),
    FrameworkFix(
        "autogen_ext",
        "AutoGen",
        "OpenAIChatCompletionClient(http_client=collector.http_client(hosts)), and "
        "tito_agents_autogen.install() for agent names",
        "autogen",
    ),
    FrameworkFix(
        "agent_framework",
        "Microsoft Agent Framework",
        "OpenAIChatCompletionClient(async_client=collector.wrap(AsyncOpenAI(...))) (or the "
        "Responses OpenAIChatClient), and Agent(..., middleware=[AgentNames()]) of "
        "tito_agents_agent_framework for agent names",
        "microsoft-agent-framework",
    ),
)
"""The frameworks checked, each with its fix (docs/frameworks.md shows each in full)."""


def imported_fixes() -> list[FrameworkFix]:
    """The fixes of the frameworks this process has imported."""
    return [fix for fix in FIXES if fix.module in sys.modules]


def fixes_named(names: Iterable[str]) -> list[FrameworkFix]:
    """The fixes of the frameworks named (as `FrameworkFix.name`, how integrations name
    themselves to `Episode.note_model_call`); unknown names have none."""
    wanted = set(names)
    return [fix for fix in FIXES if fix.name in wanted]


def response_caches() -> list[str]:
    """The imported frameworks whose response cache is on: a prompt they have answered before is
    answered again from the cache, with no request for capture to see."""
    dspy = sys.modules.get("dspy")
    return ["DSPy"] if dspy is not None and _dspy_cache_on(dspy) else []


def _dspy_cache_on(dspy: Any) -> bool:
    """DSPy's cache (`dspy.cache`, set by `dspy.configure_cache`) is on in memory or on disk, and
    the configured LM does not opt out (`dspy.LM(..., cache=False)`). Unreadable: not on."""
    try:
        cache = getattr(dspy, "cache", None)
        enabled = bool(
            getattr(cache, "enable_memory_cache", False)
            or getattr(cache, "enable_disk_cache", False)
        )
        lm = getattr(getattr(dspy, "settings", None), "lm", None)
        return enabled and getattr(lm, "cache", True) is not False
    except Exception:  # a framework's attribute that raises decides nothing
        return False
