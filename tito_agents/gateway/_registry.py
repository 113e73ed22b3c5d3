"""Episodes over HTTP: the gateway's table of open episodes, the reports of closed ones, and the
episodes a previous gateway left open (lost at its restart).

An open episode is a library `Episode` (opened by `Collector.episode`, ended by `Episode.end`), so
attribution, rewards, assembly and the sink are exactly the in-process ones. The gateway adds only
what HTTP needs: labels applied to every forwarded call, and the failed upstream requests (the
capture core does not record an attempt that got no answer), which the episode report shows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_agents.calls import count_calls
from tito_agents.collector import Collector
from tito_agents.episodes import Episode
from tito_agents.errors import EpisodeCaptureError
from tito_agents.gateway._journal import Journal

EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~-]{0,127}")
"""Episode ids travel in URL paths: letters, digits and `._:~-`, 128 at most."""
MAX_FAILURES_KEPT = 50
EMPTY_ADVICE = (
    "give the harness the episode's base URL (/episodes/{episode_id}/v1 on this gateway, the "
    "`base_url` its opening answered) or send its calls to /v1 with the header "
    "`X-Tito-Episode: {episode_id}`, and check that the harness uses the base URL it is given "
    "(many read OPENAI_BASE_URL or their own configuration instead); calls to /v1 without the "
    "header are outside any episode"
)
"""The empty-episode warning's advice for a gateway episode (the library's says to wrap a client)."""
"""Failed upstream requests listed per episode (all are counted)."""


class RegistryError(Exception):
    """A control or forwarding request names an episode in the wrong state; `status` is the HTTP
    status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class OpenEpisode:
    """An episode the gateway holds open: the library episode and what HTTP adds to it."""

    episode: Episode
    labels: dict[str, Any]
    opened_at: float
    failures: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_FAILURES_KEPT))
    failed_requests: int = 0
    forwarded: int = 0
    abandoned: int = 0
    """Requests whose client went away before its answer was whole (never samples)."""
    closing: bool = False

    def note_failure(self, status: int, path: str, message: str) -> None:
        """An upstream request of this episode that got no usable answer (the client got
        `status`)."""
        self.failed_requests += 1
        self.failures.append({"status": status, "path": path, "error": message, "at": time.time()})


class Registry:
    """Open episodes by id, reports of the last `keep_reports` closed ones, and lost ones."""

    def __init__(
        self, collector: Collector, journal: Journal | None, *, keep_reports: int = 10_000
    ) -> None:
        self.collector = collector
        self.journal = journal
        self.keep_reports = keep_reports
        self.open: dict[str, OpenEpisode] = {}
        self.closed: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.lost: dict[str, dict[str, Any]] = {}

    def recover(self) -> list[str]:
        """Load the episodes a previous gateway left open; returns their ids."""
        if self.journal is not None:
            self.lost = self.journal.recover()
        return list(self.lost)

    # ---- opening, looking up, closing ----

    def open_episode(
        self,
        episode_id: str | None,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        labels: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        sessions: bool | None = None,
    ) -> OpenEpisode:
        if episode_id is not None:
            check_id(episode_id)
            if episode_id in self.open or episode_id in self.closed or episode_id in self.lost:
                raise RegistryError(409, f"episode {episode_id!r} already exists")
        episode = self.collector.episode(
            episode_id,
            task_id=task_id,
            group_id=group_id,
            agent=agent,
            metadata=metadata,
            sessions=sessions,
        )
        episode.empty_advice = EMPTY_ADVICE.format(episode_id=episode.episode_id)
        held = OpenEpisode(episode, dict(labels or {}), time.time())
        self.open[episode.episode_id] = held
        if self.journal is not None:
            self.journal.opened(episode.episode_id, task_id=task_id, group_id=group_id)
        return held

    def get_open(self, episode_id: str) -> OpenEpisode:
        """The open episode `episode_id`, or the error that says why a call cannot go to it."""
        held = self.open.get(episode_id)
        if held is not None and not held.closing:
            return held
        if held is not None or episode_id in self.closed:
            raise RegistryError(409, f"episode {episode_id!r} is closed")
        if episode_id in self.lost:
            raise RegistryError(
                409,
                f"episode {episode_id!r} was open when the gateway restarted; its calls are lost "
                "(nothing of it was written): open a new episode",
            )
        raise RegistryError(404, f"no open episode {episode_id!r}: open it through the control API")

    async def close_episode(
        self, episode_id: str, *, reward: float | None = None, failed: bool = False
    ) -> dict[str, Any]:
        """End the episode: its samples go to the sink (assembly off the event loop), and its
        final report is kept. Closing a lost episode acknowledges it."""
        if episode_id in self.lost:
            entry = self.lost.pop(episode_id)
            if self.journal is not None:
                self.journal.forgotten(episode_id)
            return lost_report(episode_id, entry)
        held = self.open.get(episode_id)
        if held is not None and held.closing:  # another close is writing it: not unknown
            raise RegistryError(409, f"episode {episode_id!r} is being closed")
        if held is None:
            if episode_id in self.closed:
                raise RegistryError(409, f"episode {episode_id!r} is already closed")
            raise RegistryError(404, f"no open episode {episode_id!r}")
        held.closing = True  # calls from now on are refused; the report counts those in flight
        episode = held.episode
        if reward is not None:
            episode.set_reward(reward)
        capture_error: str | None = None
        try:
            await asyncio.to_thread(episode.end, failed=failed)
        except EpisodeCaptureError as exc:  # the good calls' samples are written already
            capture_error = str(exc)
        finally:
            del self.open[episode_id]
            if self.journal is not None:
                self.journal.closed(episode_id)
        report = episode_report(held, status="failed" if failed else "closed")
        if capture_error is not None:
            report["capture_error"] = capture_error
        self.closed[episode_id] = report
        while len(self.closed) > self.keep_reports:
            self.closed.popitem(last=False)
        return report

    def report(self, episode_id: str) -> dict[str, Any]:
        held = self.open.get(episode_id)
        if held is not None:
            return episode_report(held, status="closing" if held.closing else "open")
        if episode_id in self.closed:
            return self.closed[episode_id]
        if episode_id in self.lost:
            return lost_report(episode_id, self.lost[episode_id])
        raise RegistryError(404, f"no episode {episode_id!r} (unknown, or its report was dropped)")


def check_id(episode_id: str) -> None:
    if not EPISODE_ID.fullmatch(episode_id):
        raise RegistryError(
            400, "an episode id is 1-128 letters, digits or ._:~- (it travels in URL paths)"
        )


def episode_report(held: OpenEpisode, *, status: str) -> dict[str, Any]:
    """What the control API answers about an episode: the library's `EpisodeReport` (final once
    closed, counted live while open) and the failed upstream requests."""
    episode = held.episode
    report = dataclasses.asdict(episode.report)
    if status in ("open", "closing"):
        counts = count_calls(list(episode.calls))
        report.update(
            calls=counts.calls,
            complete=counts.complete,
            incomplete=counts.incomplete,
            unusable=counts.unusable,
            in_flight=episode.inflight,
            errors=[str(e) for e in list(episode.errors)],
        )
    report.update(
        status=status,
        reward=episode.reward,
        task_id=episode.task_id,
        group_id=episode.group_id,
        agent=episode.agent,
        labels=held.labels,
        forwarded=held.forwarded,
        abandoned=held.abandoned,
        failed_requests=held.failed_requests,
        upstream_failures=list(held.failures),
    )
    return report


def lost_report(episode_id: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "episode_id": episode_id,
        "status": "lost",
        "task_id": entry.get("task_id"),
        "group_id": entry.get("group_id"),
        "opened_at": entry.get("at"),
        "errors": [
            "the gateway stopped while this episode was open; its calls were not written "
            "(an episode is written whole at its close, or not at all)"
        ],
    }


def call_summaries(held: OpenEpisode) -> list[dict[str, Any]]:
    """The calls of an open episode, for per-call rewards: ids, who made them, how they ended."""
    return [
        {
            "call_id": call.call_id,
            "request_id": call.request_id,
            "seq": call.seq,
            "agent": call.agent,
            "policy": call.policy,
            "status": call.status.value,
            "finish_reason": call.finish_reason,
            "prompt_tokens": len(call.prompt_ids),
            "sampled_tokens": len(call.sampled_ids),
            "stream": call.stream,
            "reward": call.reward,
        }
        for call in sorted(held.episode.calls, key=lambda c: (c.seq, c.choice_index))
    ]
