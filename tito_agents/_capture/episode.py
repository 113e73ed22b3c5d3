"""What the capture layer calls on an episode: `CapturedEpisode`, the interface between the
capture stage and the episodes stage.

Capture resolves the episode of each request (`episodes.resolve_attribution`, or the collector's
default episode) and from then on uses only what this protocol names: the attribution it stamps
on calls, the user's session setting, and three calls that keep the episode's in-flight count and
record its calls (`episodes.Episode` implements them; user code never calls them). The episode,
not capture, reports recorded calls to the next stage (`episodes.EpisodeProcessor`).
"""

from __future__ import annotations

from typing import Protocol

from tito_agents.calls import Call
from tito_agents.config import CollectorSettings


class CapturedEpisode(Protocol):
    """An episode as the capture layer sees it (implemented by `episodes.Episode`)."""

    @property
    def episode_id(self) -> str:
        """Stamped on every call recorded on the episode."""
        ...

    @property
    def agent(self) -> str | None:
        """The agent of calls made without an agent scope (`episodes.agent`)."""
        ...

    @property
    def sessions(self) -> bool | None:
        """Token-in sessions for the episode's calls: True/False, or None to follow the wrapped
        client (`Collector.wrap(sessions=...)`)."""
        ...

    @property
    def settings(self) -> CollectorSettings:
        """The settings of the collector that opened the episode: what its token-in sessions
        start from (`end_of_turn_id`, the tail checks shared by all its sessions)."""
        ...

    def call_started(self) -> int:
        """A request of the episode is about to be sent: count it in flight and return its
        sequence number (request order within the episode). Each call is matched by exactly one
        `call_ended`."""
        ...

    def call_ended(self) -> None:
        """A request counted by `call_started` is no longer in flight: its response was recorded,
        it failed (no call), or it was sent uncaptured after all."""
        ...

    def add_calls(self, calls: list[Call]) -> int:
        """Record the calls of one response (one per choice) and report them to the next stage.
        Returns how many were new: a call id seen before (a re-delivered response) is dropped,
        and an ended episode adds none (a late call is never a sample). Runs on the request
        path: never blocks for long, never raises."""
        ...
