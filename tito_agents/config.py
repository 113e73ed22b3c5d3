"""What a `Collector` is configured with and what it counts: the settings capture reads on every
request, the policies a user chooses, and the counters. Plain data, imported by every stage and
importing none of them, so the pipeline's stages depend on it and never on the collector."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any

from tito_agents.sinks.buffered import ExportStats


class ErrorPolicy(enum.Enum):
    """What a capture problem (missing or inconsistent ids) does."""

    RAISE = "raise"
    """Fail the agent's own call with the typed error (strict mode)."""
    EPISODE = "episode"
    """Default: the agent's call gets its response unchanged; the episode's exit raises
    `EpisodeCaptureError` after writing the samples of the good calls."""
    COUNT = "count"
    """Lenient: the call is recorded as unusable and counted; nothing raises."""


class OutsideEpisode(enum.Enum):
    """What happens to a captured call made outside any episode."""

    DEFAULT = "default"
    """Default: it joins the collector's default episode and is queued for the sink as a per-call
    sample (episode id "default", no reward) as soon as it completes."""
    ERROR = "error"
    """The request is refused with `OutsideEpisodeError` before it is sent."""
    IGNORE = "ignore"
    """The request is sent untouched and nothing is captured."""


class SessionHistory(enum.Enum):
    """What a token-in session does where the model's chat template would re-render the history
    differently from what the model saw (templates that drop past reasoning: stock Qwen3,
    DeepSeek-R1, GLM)."""

    TEMPLATE = "template"
    """Default: token-in only where the template renders the history exactly as the model saw it
    (prefix checked); elsewhere the call is rendered by the server, with the reason and the fix
    in `Call.session_reason`."""
    SAMPLED = "sampled"
    """Opt-in: keep the model's own sampled tokens in context there too and render only the new
    messages (`Call.session` is "token_in_sampled"). The model then sees its past turns as it
    sampled them (past reasoning included) rather than as its template re-renders them: rollouts,
    and the policy trained on them, see longer contexts than serving with that template gives."""


class SinkErrors(enum.Enum):
    """What a sink failure does when samples are handed over."""

    LOG = "log"
    """Default: logged once and counted (`CaptureStats.sink_failures`, `lost_samples`); the
    episode's exit and the agent's calls go on."""
    RAISE = "raise"
    """Strict: the episode's exit raises the `SinkError` (after capture errors are settled).
    Calls outside any episode still never raise: their samples are written off the request path."""


@dataclass(slots=True, eq=False, weakref_slot=True)
class CaptureSettings:
    """What the capture core reads on every request. One object per collector, shared by every
    client it wraps, so a change (e.g. `policy_version` after a weight update) applies at once.
    Compared and hashed by identity: adapters may key their own per-collector state on it."""

    capture_logprobs: bool = False
    error_policy: ErrorPolicy = ErrorPolicy.EPISODE
    outside_episode: OutsideEpisode = OutsideEpisode.DEFAULT
    keep_messages: bool = True
    policy_version: str | None = None
    end_of_turn_id: int | None = None
    rescore_constrained: bool = False
    """Re-score constrained calls (and Responses calls returned without logprobs) at the episode's
    end for the policy's own logprobs."""
    session_history: SessionHistory = SessionHistory.TEMPLATE
    """Token-in sessions where the template re-renders history differently (`SessionHistory`)."""
    learned_end_of_turn: dict[tuple[str, ...], Any] = field(default_factory=dict)
    """What each (server, model, request template)'s template ends a turn with
    (`sessions.EndOfTurn`), derived by token-in sessions and shared with later episodes."""
    verified_tails: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """Tail shapes whose prefix preservation token-in sessions have checked (all episodes),
    with what was found (`sessions.TailCheck`, `sessions.Session.verified`)."""


@dataclass(slots=True)
class CaptureStats:
    """Counters over the collector's lifetime (read them; do not write them)."""

    requests: int = 0
    """Captured requests sent (each retry attempt counts)."""
    failed_attempts: int = 0
    """Attempts that got no 2xx response (the SDK may have retried them): never calls."""
    skipped_requests: int = 0
    """Requests to vLLM hosts not captured (non-JSON body, or the caller set return_token_ids=false)."""
    complete_calls: int = 0
    unusable_calls: int = 0
    incomplete_calls: int = 0
    duplicate_calls: int = 0
    late_calls: int = 0
    """Calls that completed after their episode had ended: never samples."""
    episodes: int = 0
    failed_episodes: int = 0
    empty_episodes: int = 0
    """Episodes that ended (their body did not raise) with no captured call; each is logged with
    what capture saw while it was open, so a run that escaped capture is never silent."""
    samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    sink_failures: int = 0
    """Hand-offs of samples to the sink that failed (each logged once)."""
    lost_samples: int = 0
    """Samples of those failed hand-offs (assembled, not accepted by the sink), and samples of
    calls outside any episode dropped because the export queue was full."""
    constrained_calls: int = 0
    """Complete calls sampled under a constraint (forced tool choice, structured output)."""
    rescored_calls: int = 0
    """Calls whose policy logprobs were recovered by re-scoring (constrained calls, and Responses
    calls the server returned without logprobs for every sampled id)."""
    rescore_failures: int = 0
    """Calls re-scoring could not recover (`Call.rescore_error` says why)."""
    delivery: ExportStats | None = None
    """What the buffer in front of the sink did after accepting samples (retries, spills,
    refusals; `tito_agents.sinks.ExportStats`); None when the sink has no buffer."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
