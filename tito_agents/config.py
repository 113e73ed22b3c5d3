"""What a `Collector` is configured with and what it counts: its settings (`CollectorSettings`, read
by capture on every request and by export at each episode's end), the choices a user makes (one
`...Mode` enum per failure or history choice, and `AssemblyMode`), and the counters
(`CollectorStats`, and `DeliveryStats`, those of one `BufferedSink`). Plain data, imported by every
stage and importing none of them (only the record `tito_agents.sampling`), so the pipeline's
stages depend on it and never on the collector.

"Policy" in this library means only the RL policy (the weights, or LoRA adapter, that sample an
agent's calls: `policies=`, `policy_version`). How the collector reacts to a failure or to a
history choice is a *mode* (`ErrorMode`, `SinkErrorMode`, ...): a fixed set of choices, as
`AssemblyMode` already was."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeAlias

from tito_agents._values import as_text
from tito_agents.sampling import ServerSampling


class ErrorMode(enum.Enum):
    """What a capture problem (missing or inconsistent ids) does."""

    RAISE = "raise"
    """Fail the agent's own call with the typed error (strict mode)."""
    EPISODE = "episode"
    """Default: the agent's call gets its response unchanged; the episode's exit raises
    `EpisodeCaptureError` after writing the samples of the good calls."""
    COUNT = "count"
    """Lenient: the call is recorded as unusable and counted; nothing raises."""


class OutsideEpisodeMode(enum.Enum):
    """What happens to a captured call made outside any episode."""

    DEFAULT = "default"
    """Default: it joins the collector's default episode and is queued for the sink as a per-call
    sample (episode id "default", no reward) as soon as it completes."""
    ERROR = "error"
    """The request is refused with `OutsideEpisodeError` before it is sent."""
    IGNORE = "ignore"
    """The request is sent untouched and nothing is captured."""


class SessionHistoryMode(enum.Enum):
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


class SinkErrorMode(enum.Enum):
    """What a sink failure does when samples are handed over."""

    LOG = "log"
    """Default: logged once and counted (`CollectorStats.sink_failures`, `lost_samples`); the
    episode's exit and the agent's calls go on."""
    RAISE = "raise"
    """Strict: the episode's exit raises the `SinkError` (after capture errors are settled).
    Calls outside any episode still never raise: their samples are written off the request path."""


class AssemblyMode(enum.Enum):
    """Which samples an episode's calls become (`tito_agents.assembly`)."""

    PER_CALL = "per_call"
    """One sample per complete call: exact, but the growing prompt is repeated every turn."""
    MERGED = "merged"
    """An agent's calls as few long samples, split only where a prompt rewrites history."""
    BOTH = "both"
    """Per-call samples, then merged ones, to the same sink (their ids never collide)."""

    @classmethod
    def parse(cls, value: AssemblyMode | str) -> AssemblyMode:
        """The member for an `AssemblyMode` or its plain string; `ValueError` names the choices."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"mode must be 'per_call', 'merged' or 'both', got {value!r}"
            ) from None

    @property
    def per_call(self) -> bool:
        """Whether this mode makes per-call samples."""
        return self is not AssemblyMode.MERGED

    @property
    def merged(self) -> bool:
        """Whether this mode makes merged samples."""
        return self is not AssemblyMode.PER_CALL


PolicyHook: TypeAlias = Callable[[str | None, Mapping[str, Any]], str | None]
"""An attribution hook: `(agent, labels) -> policy name or None`, called once per request."""
Policies: TypeAlias = Mapping[str, str] | PolicyHook
"""Which policy samples each agent's calls: agent name -> model / LoRA adapter name, or a hook."""


def parse_policies(value: Policies | None) -> Policies:
    """A policy mapping as stored on the settings: a hook as given, a mapping copied (a later
    change to the caller's dict does not reroute calls in flight) with its names checked."""
    if value is None:
        return {}
    if callable(value):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"policies must be a mapping agent -> model name or a callable, not {value!r}"
        )
    out = dict(value)
    for agent, policy in out.items():
        if not isinstance(agent, str) or not isinstance(policy, str) or not policy:
            raise ValueError(f"policies maps agent names to model names, got {agent!r}: {policy!r}")
    return out


VersionLabel: TypeAlias = str | int | None
"""A weights' label as given: a string, an int (a step number) or None; stored as a string."""


def parse_version_label(value: VersionLabel) -> str | None:
    """A version label as stored: an int (a step counter, numpy's too) becomes its decimal string,
    so every sink's schema (a string column) and `convert.policy_version_of` read it."""
    return as_text(value, "a policy version")


def parse_policy_versions(value: Mapping[str, VersionLabel] | None) -> dict[str, str | None]:
    """Per-policy version labels as stored on the settings (a copy: set them on the settings)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"policy_versions must map policy names to labels, not {value!r}")
    out = {}
    for policy, label in value.items():
        if not isinstance(policy, str) or not policy:
            raise ValueError(f"policy_versions maps policy names to labels, got {policy!r}")
        out[policy] = parse_version_label(label)
    return out


_CHOICES: dict[str, Any] = {
    "errors": ErrorMode,
    "outside_episode": OutsideEpisodeMode,
    "session_history": SessionHistoryMode,
    "sink_errors": SinkErrorMode,
    "assembly": AssemblyMode.parse,
    "policies": parse_policies,
    "policy_versions": parse_policy_versions,
    "policy_version": parse_version_label,
}
"""The settings that hold one of a fixed set of choices, and how a plain string becomes one."""


@dataclass(slots=True, eq=False, weakref_slot=True)
class CollectorSettings:
    """Everything a collector is configured with, in one place: `collector.settings`.

    One object per collector, shared by every client it wraps (capture reads it on every request)
    and by its sample processor (which reads it at each episode's end), so a change applies from
    the next request or episode: e.g. `collector.settings.policy_version = "v8"` after a weight
    update.
    A choice (`errors`, `assembly`, ...) may be set to its enum member or its string; it is
    stored as the member (an unknown string raises `ValueError`). Compared and hashed by
    identity: adapters may key their own per-collector state on it.
    """

    capture_logprobs: bool = False
    """Ask vLLM for the logprob of each sampled token (unless the caller set `logprobs`)."""
    errors: ErrorMode = ErrorMode.EPISODE
    """What a capture problem does (`Collector(errors=...)`)."""
    outside_episode: OutsideEpisodeMode = OutsideEpisodeMode.DEFAULT
    """What a call outside any episode does; each episode reads it when it is opened."""
    keep_messages: bool = True
    """Keep each request's chat messages on its `Call` (in memory)."""
    policy_version: str | None = None
    """The label of the weights that sample now (async RL); set it on each weight update. With
    several policies, the label of those `policy_versions` does not name."""
    policies: Policies = field(default_factory=dict)
    """Which policy samples each agent's calls (`Collector(policies=...)`): agent name -> the
    model / LoRA adapter name its requests are sent with, or a hook `(agent, labels) -> name or
    None`. An agent the mapping does not name (or the hook answers None for) goes as written."""
    policy_versions: dict[str, str | None] = field(default_factory=dict)
    """The weights' label per policy (`{"planner-lora": "3"}`): set an entry on each update of
    that policy; a policy not listed takes `policy_version`."""
    end_of_turn_id: int | None = None
    """The end-of-turn token of token-in sessions (None: derived from the chat template)."""
    rescore_constrained: bool = False
    """Re-score constrained calls (and Responses calls returned without logprobs) at the episode's
    end for the policy's own logprobs."""
    session_history: SessionHistoryMode = SessionHistoryMode.TEMPLATE
    """Token-in sessions where the template re-renders history differently."""
    sink_errors: SinkErrorMode = SinkErrorMode.LOG
    """What a sink failure does."""
    assembly: AssemblyMode = AssemblyMode.PER_CALL
    """Which samples an episode's calls become."""
    turn_discount: float = 1.0
    """Discount of per-call rewards inside a merged sample (checked when one is made)."""
    tokenizer: Any = None
    """The served model's tokenizer, if given: only names divergences and shows excerpts."""
    record_messages: bool = False
    """Write each chat call's request messages and tools into its samples' metadata."""
    server_sampling: ServerSampling | None = None
    """What the server adds to each request's sampling (its `--logprobs-mode`, its
    generation_config defaults), as the user declared it (`Collector(logprobs_mode=...,
    sampling_defaults=...)`, or `tito_agents.sampling.probe_logprobs_mode`); recorded on every call
    (`Call.server_sampling`) and so on every span. None: unknown (spans say "request")."""
    learned_end_of_turn: dict[tuple[str, ...], Any] = field(default_factory=dict)
    """What each (server, model, request template)'s template ends a turn with
    (`sessions.EndOfTurn`), derived by token-in sessions and shared with later episodes."""
    verified_tails: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """Tail shapes whose prefix preservation token-in sessions have checked (all episodes),
    with what was found (`sessions.TailCheck`, `sessions.Session.verified`)."""

    def __setattr__(self, name: str, value: Any) -> None:
        parse = _CHOICES.get(name)
        object.__setattr__(self, name, value if parse is None else parse(value))

    def policy_for(self, agent: str | None, labels: Mapping[str, Any]) -> str | None:
        """The policy (model / adapter name) a call of `agent` is sent to; None: as written."""
        policies = self.policies
        if callable(policies):
            chosen = policies(agent, labels)
            if chosen is not None and (not isinstance(chosen, str) or not chosen):
                raise ValueError(f"the policies hook returned {chosen!r}, not a model name")
            return chosen
        return None if agent is None else policies.get(agent)

    def version_for(self, policy: str | None) -> str | None:
        """The weights' label of `policy`: its own `policy_versions` entry, else `policy_version`."""
        label = self.policy_version
        if policy is not None and policy in self.policy_versions:
            label = self.policy_versions[policy]  # entries set in place are not parsed: here
        return label if label is None or isinstance(label, str) else str(label)


@dataclass(slots=True)
class DeliveryStats:
    """What a `BufferedSink` did (read them; the sink updates them)."""

    accepted: int = 0
    """Samples handed to `write`."""
    exported: int = 0
    """Samples the inner sink accepted (including replayed ones)."""
    buffered: int = 0
    """Samples in memory now (waiting or being delivered)."""
    spilled: int = 0
    """Samples written to the spill log."""
    replayed: int = 0
    """Samples delivered from the spill log (this process's or one left by a crashed process)."""
    spill_pending: int = 0
    """Samples in the spill log now."""
    failed_attempts: int = 0
    """Delivery attempts that raised (each was retried or rejected)."""
    rejected: int = 0
    """Samples refused for good by the destination (kept in the rejected log, never dropped)."""
    blocked_writes: int = 0
    """`write` calls that had to wait for room (backpressure)."""
    blocked_seconds: float = 0.0
    spill_failures: int = 0
    """Spill appends that failed (e.g. the spill disk is full too); those writes waited instead."""
    refused_writes: int = 0
    """`write_nowait` calls that found no room and raised (the caller kept the samples)."""
    paced_writes: int = 0
    """`write` / `awrite` calls that gave the worker its turn (it was `pace_after` behind)."""
    paced_seconds: float = 0.0
    last_error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class EmptyEpisodeCause(enum.StrEnum):
    """Why an episode ended with no captured call, as far as the collector can tell; each is
    logged with its fix when it happens and counted in `CollectorStats.empty_episode_causes`."""

    IN_FLIGHT = "in_flight"
    """Its requests went through capture but had no response yet (a stream left open, a task
    not awaited)."""
    BYPASSED_CAPTURE = "bypassed_capture"
    """A framework integration saw its framework complete model calls in the episode, and no
    captured request was sent (`Episode.note_model_call`): the framework's client is not the
    capturing one, or a response cache answered."""
    OUTSIDE_EPISODE = "outside_episode"
    """Calls were captured outside any episode while it was open: the run left its context."""
    RESPONSE_CACHE = "response_cache"
    """A framework's response cache is on (DSPy's) while capture works for other episodes:
    repeated prompts (a group's identical rollouts) were answered from the cache."""
    NO_CAPTURING_CLIENT = "no_capturing_client"
    """Nothing was captured anywhere: the agent's requests went through a client without capture
    (an unwrapped client, a framework's own HTTP client, a client built per request)."""


@dataclass(slots=True)
class CollectorStats:
    """Counters over the collector's lifetime (read them; do not write them)."""

    requests: int = 0
    """Captured requests sent (each retry attempt counts)."""
    failed_attempts: int = 0
    """Attempts that got no 2xx response (the SDK may have retried them): never calls."""
    skipped_requests: int = 0
    """Requests to vLLM hosts not captured (non-JSON body, or the caller set return_token_ids=false)."""
    uncaptured_requests: int = 0
    """Requests to vLLM hosts sent as the caller wrote them because capture could not read a
    field it needs (a value vLLM refuses, e.g. `n: "two"`) or failed preparing them: the server
    gives its own answer. Each cause is logged once."""
    complete_calls: int = 0
    """Calls recorded while their episode was open with status COMPLETE. The three status
    counters use `calls.count_calls`, the one definition every report shares."""
    unusable_calls: int = 0
    """... with status UNUSABLE (no exact ids)."""
    incomplete_calls: int = 0
    """... with status INCOMPLETE: the response started but never finished (cut, failed
    mid-stream, abandoned). A call in flight when its episode ends is in none of the three
    (`late_calls` if it finishes later)."""
    duplicate_calls: int = 0
    """Re-delivered responses (call ids already recorded): dropped, never counted as calls."""
    late_calls: int = 0
    """Calls that completed after their episode had ended: never samples."""
    episodes: int = 0
    failed_episodes: int = 0
    empty_episodes: int = 0
    """Episodes that ended (their body did not raise) with no captured call; each is logged with
    what capture saw while it was open, so a run that escaped capture is never silent."""
    empty_episode_causes: dict[EmptyEpisodeCause, int] = field(default_factory=dict)
    """`empty_episodes` by the cause each was logged with."""
    bypassed_calls: int = 0
    """Model calls framework integrations saw completed in an episode beyond the captured
    requests it sent (`Episode.note_model_call`): calls that reached the model some other way
    (a client without capture, a response cache). Each episode with some is logged with the fix."""
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
    delivery: DeliveryStats | None = None
    """What the buffer in front of the sink did after accepting samples (retries, spills,
    refusals; `tito_agents.config.DeliveryStats`, also named `tito_agents.sinks.DeliveryStats`);
    None when the sink has no buffer."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
