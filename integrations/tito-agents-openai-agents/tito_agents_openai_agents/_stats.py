"""Counters of the integration and what happens to a model call that went out uncaptured.

The Agents SDK's tracing and model defaults are process-wide, so the counters are too: one
`AgentsStats` per process, shared by every `install`. What an uncaptured call does is chosen per
collector (`install(..., uncaptured=...)`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import Literal

import tito_agents
from tito_agents import Collector
from tito_agents.config import CollectorSettings
from tito_agents_openai_agents._errors import UncapturedModelCallError

logger = logging.getLogger("tito_agents.openai_agents")

Uncaptured = Literal["error", "count"]
""""error": an uncaptured model call inside an episode is an error of that episode (its exit raises
`EpisodeCaptureError` under the collector's default error policy); "count": such calls pass
through, counted and logged once per agent."""

_POLICIES: weakref.WeakKeyDictionary[CollectorSettings, Uncaptured] = weakref.WeakKeyDictionary()
"""Per collector (keyed on its settings object, which its episodes carry)."""
_WARNED: set[tuple[str | None, str]] = set()


@dataclass
class AgentsStats:
    """Process-wide counters (read them; do not write them)."""

    labelled_by_span: int = 0
    """Captured requests whose agent came from the SDK's tracing spans."""
    labelled_by_filter: int = 0
    """Captured requests whose agent came from the run config's model-input filter (tracing off)."""
    model_calls: int = 0
    """Model calls seen in tracing spans (successful attempts only)."""
    uncaptured_calls: int = 0
    """Model calls seen in tracing spans that sent no captured request (no sample)."""
    uncaptured_by_agent: dict[str | None, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count_label(self, *, by_span: bool) -> None:
        with self._lock:
            if by_span:
                self.labelled_by_span += 1
            else:
                self.labelled_by_filter += 1

    def count_model_call(self) -> None:
        with self._lock:
            self.model_calls += 1

    def count_uncaptured(self, agent: str | None) -> None:
        with self._lock:
            self.uncaptured_calls += 1
            self.uncaptured_by_agent[agent] = self.uncaptured_by_agent.get(agent, 0) + 1

    def as_dict(self) -> dict[str, object]:
        with self._lock:
            return {
                "labelled_by_span": self.labelled_by_span,
                "labelled_by_filter": self.labelled_by_filter,
                "model_calls": self.model_calls,
                "uncaptured_calls": self.uncaptured_calls,
                "uncaptured_by_agent": dict(self.uncaptured_by_agent),
            }


STATS = AgentsStats()


def set_policy(collector: Collector, policy: Uncaptured) -> None:
    if policy not in ("error", "count"):
        raise tito_agents.ConfigurationError(
            f"uncaptured must be 'error' or 'count', got {policy!r}"
        )
    _POLICIES[collector.settings] = policy


def policy_for(collector: Collector | None) -> Uncaptured:
    """The policy of `collector` ("error" for one that was never installed)."""
    if collector is None:
        return "error"
    return _POLICIES.get(collector.settings, "error")


def record_uncaptured(agent: str | None, kind: str, client_url: str | None = None) -> None:
    """A model call of `agent` ended (or is about to go out) without capture: count it, log it
    once per agent with the fix, and make it an error of the current episode unless its collector
    lets such calls pass. `client_url`: the base URL of the unwrapped client, when known."""
    STATS.count_uncaptured(agent)
    error = UncapturedModelCallError(agent, kind, client_url)
    episode = tito_agents.current_episode()
    policy = _POLICIES.get(episode.settings, "error") if episode is not None else "error"
    key = (agent, kind)
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning("%s (counted in capture.stats.uncaptured_by_agent)", error)
    if episode is not None and policy == "error" and not episode.closed:
        episode.add_error(error)
