"""Token-in session state, kept by the capture layer per (episode, agent).

The sessions are capture state: an episode knows only whether it wants them (`Episode.sessions`).
One store serves the whole process, so every wrapped client that sends an episode's requests (a
collector wraps several; an agent may use clients of two collectors) continues the same session of
each agent, as the agent's conversation does. Episodes are held weakly: an episode's sessions are
released with the episode, however many episodes a process runs.
"""

from __future__ import annotations

import threading
import weakref

from tito_agents._capture.episode import CapturedEpisode
from tito_agents._capture.sessions import Session


class SessionStore:
    """The token-in sessions of each (episode, agent), created on first use and released with
    the episode (a weak reference: the store never keeps an episode alive)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: weakref.WeakKeyDictionary[CapturedEpisode, dict[str | None, Session]] = (
            weakref.WeakKeyDictionary()
        )

    def session_for(self, episode: CapturedEpisode, agent: str | None) -> Session:
        """The session of `agent` in `episode`: created on first use from the settings of the
        collector that opened the episode (its `end_of_turn_id`, the tail checks its sessions
        share)."""
        with self._lock:
            by_agent = self._sessions.get(episode)
            if by_agent is None:
                by_agent = self._sessions[episode] = {}
            session = by_agent.get(agent)
            if session is None:
                settings = episode.settings
                session = by_agent[agent] = Session(
                    end_of_turn_id=settings.end_of_turn_id, verified=settings.verified_tails
                )
            return session

    def episodes(self) -> int:
        """How many episodes have sessions held now (released ones are not counted)."""
        with self._lock:
            return len(self._sessions)


SESSIONS = SessionStore()
"""The store every `CaptureCore` uses unless given its own."""
