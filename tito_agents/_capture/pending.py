"""A captured request in flight: what was asked, by whom and when, until its response is
recorded (shared by the capture core and the stream tee)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tito_agents._capture.episode import CapturedEpisode
from tito_agents._capture.sessions import Plan, Session, SessionDecision
from tito_agents._capture.wire import (
    RequestInfo,
)
from tito_agents.calls import ScoringEndpoint

logger = logging.getLogger("tito_agents")


@dataclass(slots=True)
class PendingCall:
    """A captured request in flight: what was asked, by whom, and when."""

    info: RequestInfo
    episode: CapturedEpisode
    agent: str | None
    labels: Mapping[str, Any]
    seq: int
    policy_version: str | None
    started_at: float
    first_byte_at: float | None = None
    finished: bool = False
    session: Session | None = None
    """Token-in session mode: the session of (episode, agent), from the capture layer's
    `SessionStore`."""
    plan: Plan | None = None
    """Token-in session mode: the request plan the transport drives before sending."""
    decision: SessionDecision | None = None
    session_fallback: str | None = None
    """Why a call of a session episode is not planned as a session turn (a `FallbackReason`
    text: e.g. a Responses request the chat conversion does not cover, server-held history)."""
    session_payload: dict[str, Any] | None = None
    """The chat request the session plans with: the request itself, or the chat conversation a
    Responses request renders as (`responses.chat_view.chat_view`)."""
    scoring: ScoringEndpoint | None = None
    """Where a constrained call is re-scored at the episode's end (re-scoring on)."""
    session_ms: float | None = None
    """Time the session plan took before the request was sent (/tokenize round trips included)."""
    policy: str | None = None
    """The policy (model / LoRA adapter name) the request was routed to (`Call.policy`)."""


def note_routing(logged: set[str], agent: str | None, written: Any, policy: str | None) -> None:
    """Log once per (agent, model, policy) that the mapping replaced the model a caller named:
    the mapping wins (it is how agents whose code names one model reach their adapter)."""
    if policy is None:
        return
    key = f"routed:{agent}:{written}:{policy}"
    if written is not None and key not in logged:
        logged.add(key)
        logger.info(
            "calls of agent %r name model %r: sent to its policy %r (Collector(policies=...))",
            agent,
            written,
            policy,
        )
