"""Captured calls: what one choice of one vLLM response produced, with the ids the engine sampled.

A `Call` is the unit the capture layer records and the assembler consumes. Token arrays are numpy
(int32 ids, float32 logprobs), never Python int lists, so a long call costs about 8 bytes per token.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.errors import CaptureError
from tito_agents.sampling import ServerSampling

IdArray = npt.NDArray[np.int32]
LogprobArray = npt.NDArray[np.float32]

EMPTY_IDS: IdArray = np.zeros(0, dtype=np.int32)

"""The label that carries a routed call's policy into its samples' metadata (`labels` of a
per-call sample, `call_labels` of a merged one) while samples have no field of their own; named
apart from the free-form labels users set (a user's own "policy" label means nothing here)."""


class CallStatus(enum.Enum):
    """Whether a call can become a sample. Every report counts calls by this status alone
    (`count_calls`); a call still in flight has none yet and is counted apart."""

    COMPLETE = "complete"
    """The response finished and its ids are exact: it becomes a sample."""
    INCOMPLETE = "incomplete"
    """The response started but never finished: its stream was cut (connection lost, no `[DONE]`
    or final event), failed mid-stream, or was abandoned by its caller (closed early, its task
    cancelled, the gateway's client gone). Never a sample."""
    UNUSABLE = "unusable"
    """The response lacks exact ids (missing, mismatched, malformed): never a sample."""


@dataclass(frozen=True, slots=True)
class CallCounts:
    """Recorded calls by status: the one definition of "complete", "incomplete" and "unusable"
    that `EpisodeReport`, `CollectorStats` and the gateway's episode report share.

    Only recorded calls count, each once (a re-delivered response is a duplicate, not a call).
    A call still in flight (its request sent, its response not finished) is in none of these:
    the episode report counts those an episode ended with as `in_flight` (never samples of it;
    one that finishes later is a `late_call`, whatever its status). A request answered with an
    error status is no call at all (`CollectorStats.failed_attempts`).
    """

    complete: int = 0
    incomplete: int = 0
    unusable: int = 0

    @property
    def calls(self) -> int:
        return self.complete + self.incomplete + self.unusable


def count_calls(calls: Iterable[Call]) -> CallCounts:
    """How many of `calls` are complete, incomplete and unusable (`CallCounts`)."""
    complete = incomplete = unusable = 0
    for call in calls:
        if call.status is CallStatus.COMPLETE:
            complete += 1
        elif call.status is CallStatus.INCOMPLETE:
            incomplete += 1
        else:
            unusable += 1
    return CallCounts(complete, incomplete, unusable)


class Endpoint(enum.Enum):
    """The OpenAI-compatible endpoint a call went to."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    """The Responses API (`POST /v1/responses`): one call per response (choice index 0)."""
    MESSAGES = "messages"
    """Anthropic's Messages API (`POST /v1/messages`), as a request path only: capture sends it
    as vLLM's own chat conversion, so its calls are recorded as CHAT calls with
    `Call.translated_from == "messages"`."""


class SessionNote(enum.StrEnum):
    """Values of `Call.session`: how the prompt of a call in session mode was made.

    A `StrEnum`, unlike the configuration choices (`ErrorMode`, `AssemblyMode`): it is data on
    every session call, documented and compared as the plain strings ("token_in", ...), so each
    member equals, prints and serializes as its string.
    """

    FIRST = "first"
    """The first call of a session: rendered by the server as usual."""
    TOKEN_IN = "token_in"
    """Previous prompt + sampled ids + delta, sent as token ids."""
    TOKEN_IN_BRIDGED = "token_in_bridged"
    """As TOKEN_IN, after bridging a turn that ended without its end-of-turn token (context)."""
    TOKEN_IN_SAMPLED = "token_in_sampled"
    """As TOKEN_IN where the template would re-render the history differently (it drops past
    reasoning, ...): the model's sampled tokens were kept (`SessionHistoryMode.SAMPLED`, opt-in)."""
    RESAMPLE = "resample"
    """The same messages as an earlier turn: its token prompt again (a sibling branch)."""
    FALLBACK = "fallback"
    """Rendered by the server; `Call.session_reason` says why."""


@dataclass(frozen=True, slots=True)
class ScoringEndpoint:
    """Where the ids of a constrained call can be re-scored: the `/completions` URL of the server
    that sampled them and the headers it needs. In memory only, never serialized or printed with
    its headers (they may hold the caller's Authorization)."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"ScoringEndpoint({self.url!r})"


@dataclass(slots=True)
class Call:
    """One choice of one captured response.

    `n>1` requests produce n calls that share `prompt_ids` (the same array object) and `request_id`.
    `call_id` is `"<response id>/<choice index>"`: stable across re-deliveries and unique per choice.
    """

    call_id: str
    request_id: str
    endpoint: Endpoint
    choice_index: int
    status: CallStatus
    prompt_ids: IdArray
    sampled_ids: IdArray
    logprobs: LogprobArray | None
    finish_reason: str | None
    stop_reason: int | str | None
    model: str | None
    http_status: int
    stream: bool
    started_at: float
    ended_at: float
    sampling: dict[str, Any] = field(default_factory=dict)
    routed_experts: str | None = None
    error: CaptureError | None = None
    episode_id: str | None = None
    agent: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)
    seq: int = 0
    """Order of the request within its episode (assigned when the request is sent)."""
    reward: float | None = None
    policy_version: str | None = None
    policy: str | None = None
    """The policy that sampled the call: the model / LoRA adapter name its request was routed to
    by `Collector(policies=...)` (the request's `model` was set to it); None for calls no mapping
    routed (sent with the caller's own `model`, which `model` names as the server answered it)."""
    messages: list[dict[str, Any]] | None = None
    """The chat messages of the request, kept in memory (not persisted) for drift checks."""
    tools: list[dict[str, Any]] | None = None
    session: SessionNote | None = None
    """In token-in session mode, how the prompt was made (`SessionNote`, equal to its
    string: "first", "token_in", ...); else None."""
    session_reason: str | None = None
    """Why a session call fell back to server rendering (or was bridged)."""
    session_ms: float | None = None
    """Latency the session added before sending (the /tokenize round trips and bookkeeping)."""
    constrained: str | None = None
    """How the request constrained decoding ("tool_choice=required", "response_format=json_schema",
    ...; `tito_agents._capture.wire.request.constraint_of`), None for free sampling. vLLM's logprobs of a
    constrained call are those of the grammar-masked distribution."""
    policy_logprobs: LogprobArray | None = None
    """The policy's own logprobs of the sampled ids, re-scored without the mask (one per sampled
    id); set at the episode's end when the collector re-scores constrained calls, and calls the
    server returned without a logprob for every sampled id (Responses API)."""
    rescore_error: str | None = None
    """Why re-scoring this call failed (its flag stays; nothing is guessed)."""
    tool_calls: list[dict[str, Any]] | None = None
    """Responses API: the function calls the response made, one dict per `function_call` output
    item (`call_id`, `name`, `arguments` as the JSON text the model wrote, `id`); Messages calls
    (`translated_from == "messages"`): one per `tool_use` block, the same keys (`call_id` and `id`
    both the block's id); None when it made none (and for chat and completions calls, whose tool
    calls stay in their messages)."""
    reasoning: list[str] | None = None
    """Responses API: the text of each `reasoning` output item (reasoning-parser servers);
    Messages calls: the text of the `thinking` block; None when the response had none."""
    translated_from: str | None = None
    """The API the caller spoke when capture sent the call as a chat completion: "messages" for
    Anthropic Messages calls (the caller got the answer converted back, as vLLM's `/v1/messages`
    answers it); None for calls recorded as sent."""
    scoring: ScoringEndpoint | None = field(default=None, repr=False)
    """Where to re-score this call (in memory only; set when re-scoring is on)."""
    server_sampling: ServerSampling | None = None
    """What the server adds to the request's sampling (its generation_config defaults, its
    logprobs mode), when the capture learned or was told it; None: unknown (spans then say
    "request" and no logprobs mode; `tito_agents.sampling`)."""

    @property
    def num_sampled(self) -> int:
        """How many tokens the engine sampled for this choice (EOS and stop tokens included)."""
        return int(self.sampled_ids.shape[0])

    @property
    def token_ids(self) -> IdArray:
        """Prompt ids followed by the sampled ids."""
        return np.concatenate((self.prompt_ids, self.sampled_ids))

    def __repr__(self) -> str:
        return (
            f"Call({self.call_id!r}, status={self.status.value}, agent={self.agent!r}, "
            f"prompt={self.prompt_ids.shape[0]}, sampled={self.sampled_ids.shape[0]}, "
            f"finish={self.finish_reason!r})"
        )


def policy_of(sample: Any) -> str | None:
    """The policy that sampled a `Sample` (its `policy` field: `Collector(policies=...)`), None
    when no mapping routed its calls; also takes anything with a `policy` attribute (a `Call`)."""
    policy = getattr(sample, "policy", None)
    return None if policy is None else str(policy)
