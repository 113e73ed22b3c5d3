"""Per-agent views of an episode: its calls grouped by agent, and rewards given per agent.

A multi-agent run often deserves credit per agent (did triage route well? did the specialist
answer?). Set these after the run, inside the episode, before it ends and writes its samples.
"""

from __future__ import annotations

from tito_agents import Call, CallStatus, Episode


def calls_by_agent(episode: Episode, *, complete_only: bool = True) -> dict[str | None, list[Call]]:
    """The episode's calls per agent label, each list in request order."""
    grouped: dict[str | None, list[Call]] = {}
    for call in sorted(episode.calls, key=lambda c: (c.seq, c.choice_index)):
        if complete_only and call.status is not CallStatus.COMPLETE:
            continue
        grouped.setdefault(call.agent, []).append(call)
    return grouped


def set_agent_reward(episode: Episode, agent: str | None, reward: float | None) -> int:
    """Give `reward` to every call of `agent` in the episode (per-call samples: it replaces the
    episode reward of those calls; merged samples: it is added to it). Returns how many calls got
    it; 0 when the agent made none."""
    matched = [call for call in episode.calls if call.agent == agent]
    for call in matched:
        episode.set_call_reward(call, reward)
    return len(matched)
