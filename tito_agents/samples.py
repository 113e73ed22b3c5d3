"""Trainer-ready samples: token ids, loss mask, rollout logprobs and reward, with their provenance.

One `Sample` holds one call (per-call mode) or several calls of one agent merged into one sequence
(merged mode); `spans` says where each call's sampled tokens sit. Arrays are unshifted: position t
holds token t, its loss bit and the logprob the engine gave token t when it sampled it.

Logprobs, for trainers (docs/converters.md): `logprobs` is what the engine returned when it sampled
(the rollout). On a span sampled under a constraint (`CallSpan.constrained`: forced tool choice,
structured output) vLLM returns the logprobs of the grammar-masked distribution, which no trainer
recomputes; `CallSpan.logprob_source` says which kind each span holds, and `policy_logprobs`, when
present, holds the policy's own logprob on every trained token (re-scored on constrained spans).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from tito_agents.calls import IdArray, LogprobArray
from tito_agents.errors import SampleFormatError
from tito_agents.sampling import SamplingParams

MaskArray = npt.NDArray[np.uint8]

SCHEMA_VERSION = 1

SampleView = Literal["per_call", "merged"]
"""Which assembly view a sample belongs to: "per_call" (one call: its prompt, then what it
sampled) or "merged" (an agent's calls merged into one sequence). With `assembly="both"` every
call is in one sample of each view: train on one view, never both."""
VIEWS: tuple[SampleView, ...] = ("per_call", "merged")

_MAX_ID = 2**31 - 1

SUMMARIZER_ROLE = "summarizer"
"""`CallSpan.role` of a call that summarised its agent's history (label `role="summarizer"`, or
`role="summariser"`: assembly reads both spellings as this one)."""
ROLE_LABEL = "role"
"""The call label whose value becomes `CallSpan.role`."""
REWRITE_KINDS = (
    "summary",
    "prefix_truncated",
    "message_edited",
    "reasoning_cleared",
    "rerendered",
    "completion_truncated",
    "other",
)
"""The values of `Sample.rewrite` (`tito_agents.assembly.lineage` says how each is told)."""


@dataclass(slots=True)
class CallSpan:
    """Where one captured call sits inside a sample.

    `context_start:start` are the tokens this call added as context (prompt delta, loss 0);
    `start:end` are the tokens it sampled (loss 1). Per-call samples have `context_start == 0`.
    """

    call_id: str
    context_start: int
    start: int
    end: int
    finish_reason: str | None = None
    reward: float | None = None
    policy_version: str | None = None
    constrained: str | None = None
    """How decoding of this call was constrained ("tool_choice=required",
    "response_format=json_schema", ...), None for free sampling."""
    logprob_source: str | None = None
    """What the span's logprobs are: "policy" (free sampling: `Sample.logprobs` are the policy's
    own), "masked" (constrained: `Sample.logprobs` are those of the masked distribution, unusable
    for importance ratios), "rescored" (constrained, or returned without logprobs, as vLLM's
    Responses API does for function-call tokens: `Sample.policy_logprobs` holds the policy's own,
    re-scored; `Sample.logprobs` is never filled in for them), None (no logprobs captured)."""
    rescore_error: str | None = None
    """Why a span could not be re-scored."""
    sampling: SamplingParams | None = None
    """How the engine sampled the span's tokens (temperature, top-p/k, min-p, penalties, logit
    bias, seed; `tito_agents.sampling`); None when the request's values could not be read."""
    sampling_source: str | None = None
    """Where `sampling` came from: "request", "request+server_defaults" or "declared"."""
    logprobs_mode: str | None = None
    """The server's `--logprobs-mode` ("raw_logprobs": before temperature and truncation,
    vLLM's default; "processed_logprobs": what it sampled from), None when unknown."""
    role: str | None = None
    """The call's role label (`tito_agents.labels(role=...)`, or set by an integration):
    "summarizer" for a call that summarised the agent's history (`SUMMARIZER_ROLE`), None when
    unlabelled. Trained like any other span: a masked summary would not learn to summarise."""

    @property
    def truncated(self) -> bool:
        """The span was sampled from a truncated distribution (top-k, top-p or min-p)."""
        return self.sampling is not None and self.sampling.is_truncated

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "context_start": self.context_start,
            "start": self.start,
            "end": self.end,
            "finish_reason": self.finish_reason,
            "reward": self.reward,
            "policy_version": self.policy_version,
            "constrained": self.constrained,
            "logprob_source": self.logprob_source,
            "rescore_error": self.rescore_error,
            "sampling": None if self.sampling is None else self.sampling.to_dict(),
            "sampling_source": self.sampling_source,
            "logprobs_mode": self.logprobs_mode,
            "role": self.role,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CallSpan:
        sampling = data.get("sampling")
        return cls(
            call_id=str(data["call_id"]),
            context_start=int(data["context_start"]),
            start=int(data["start"]),
            end=int(data["end"]),
            finish_reason=data.get("finish_reason"),
            reward=data.get("reward"),
            policy_version=data.get("policy_version"),
            constrained=data.get("constrained"),
            logprob_source=data.get("logprob_source"),
            rescore_error=data.get("rescore_error"),
            sampling=None if sampling is None else SamplingParams.from_dict(sampling),
            sampling_source=data.get("sampling_source"),
            logprobs_mode=data.get("logprobs_mode"),
            role=data.get("role"),
        )


@dataclass(slots=True)
class Sample:
    """One training sequence. Field names are part of the public schema (docs/samples.md)."""

    sample_id: str
    episode_id: str
    agent: str | None
    token_ids: IdArray
    loss_mask: MaskArray
    logprobs: LogprobArray | None
    """Rollout logprob on sampled tokens, 0.0 elsewhere; None when logprobs were not captured."""
    reward: float | None
    call_ids: list[str]
    spans: list[CallSpan]
    task_id: str | None = None
    group_id: str | None = None
    model: str | None = None
    start_reason: str = "call"
    end_reason: str = "call"
    metadata: dict[str, Any] = field(default_factory=dict)
    policy_logprobs: LogprobArray | None = None
    """The policy's own (unmasked) logprob on every trained token, 0.0 elsewhere: re-scored on
    spans whose `logprob_source` is "rescored", equal to `logprobs` on the others. Present only
    when some span was re-scored and every trained token has a policy logprob; use it for
    importance ratios when present, else `logprobs` (see `constrained_mask`)."""
    view: SampleView = "per_call"
    """The assembly view this sample belongs to ("per_call" or "merged"; see `SampleView`).
    Files written before the field existed are read with the view their `start_reason` implies
    (a per-call sample starts with reason "call")."""
    trajectory_id: str | None = None
    """Merged samples: the trajectory (one agent's run in one episode) this sample is a segment
    of; every segment of it shares the id (`trajectory_id_for`). None on per-call samples."""
    segment_index: int | None = None
    """Merged samples: the segment's position in its trajectory, 0, 1, ... in order of its
    first call. A new segment starts where the agent's history was rewritten (compaction,
    truncation, cleared reasoning, an edited message), resampled or branched."""
    prev_sample_id: str | None = None
    """Merged samples: the `sample_id` of the trajectory's previous segment (None for segment 0)."""
    rewrite: str | None = None
    """How this segment's first prompt rewrote the history before it, where that can be told
    (`REWRITE_KINDS`: "summary", "prefix_truncated", "message_edited", "reasoning_cleared",
    "rerendered", "completion_truncated", "other"); None on a trajectory's first segment, on
    resamples and branches (siblings, not rewrites), on summarising calls and per-call samples."""
    policy: str | None = None
    """The model / LoRA adapter that sampled it, where `Collector(policies=...)` routed its calls
    (one agent's calls, so one policy); None otherwise. GRPO groups are per (policy, group)."""

    @property
    def is_summary(self) -> bool:
        """Whether the sample holds a summarising call (a span with role "summarizer")."""
        return any(span.role == SUMMARIZER_ROLE for span in self.spans)

    def constrained_mask(self) -> MaskArray:
        """1 on trained tokens sampled under a constraint, 0 elsewhere."""
        mask = np.zeros(self.token_ids.shape[0], dtype=np.uint8)
        for span in self.spans:
            if span.constrained is not None:
                mask[span.start : span.end] = 1
        return mask

    def ratio_logprobs(self) -> LogprobArray | None:
        """The logprobs a trainer should take as the old policy's in importance ratios:
        `policy_logprobs` when present, else `logprobs` (masked spans show in `constrained_mask`)."""
        return self.policy_logprobs if self.policy_logprobs is not None else self.logprobs

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_trained(self) -> int:
        """How many positions carry loss 1 (tokens the engine sampled). `count_nonzero`: a
        uint8 `sum` widens every element first and costs ~10x more per sample."""
        return int(np.count_nonzero(self.loss_mask))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (numpy arrays stay arrays; orjson serializes them natively)."""
        return {
            "schema": SCHEMA_VERSION,
            "sample_id": self.sample_id,
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "group_id": self.group_id,
            "agent": self.agent,
            "model": self.model,
            "reward": self.reward,
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "call_ids": self.call_ids,
            "spans": [s.to_dict() for s in self.spans],
            "start_reason": self.start_reason,
            "end_reason": self.end_reason,
            "metadata": self.metadata,
            "policy_logprobs": self.policy_logprobs,
            "trajectory_id": self.trajectory_id,
            "segment_index": self.segment_index,
            "prev_sample_id": self.prev_sample_id,
            "rewrite": self.rewrite,
            "policy": self.policy,
            "view": self.view,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Sample:
        """Validate and build a sample from its JSON mapping; `SampleFormatError` on anything wrong."""
        if not isinstance(data, dict):
            raise SampleFormatError("a sample must be a JSON object")
        try:
            token_ids = id_array(data["token_ids"], "token_ids")
            loss_mask = np.asarray(data["loss_mask"], dtype=np.uint8)
            raw_lp = data.get("logprobs")
            logprobs = None if raw_lp is None else np.asarray(raw_lp, dtype=np.float32)
            raw_plp = data.get("policy_logprobs")
            policy_lp = None if raw_plp is None else np.asarray(raw_plp, dtype=np.float32)
            sample = cls(
                sample_id=str(data["sample_id"]),
                episode_id=str(data["episode_id"]),
                agent=data.get("agent"),
                token_ids=token_ids,
                loss_mask=loss_mask,
                logprobs=logprobs,
                reward=data.get("reward"),
                call_ids=[str(c) for c in data["call_ids"]],
                spans=[CallSpan.from_dict(s) for s in data.get("spans", [])],
                task_id=data.get("task_id"),
                group_id=data.get("group_id"),
                model=data.get("model"),
                start_reason=str(data.get("start_reason", "call")),
                end_reason=str(data.get("end_reason", "call")),
                metadata=dict(data.get("metadata") or {}),
                policy_logprobs=policy_lp,
                view=view_of(data.get("view"), data.get("start_reason", "call")),
                trajectory_id=_str_or_none(data.get("trajectory_id")),
                segment_index=_int_or_none(data.get("segment_index")),
                prev_sample_id=_str_or_none(data.get("prev_sample_id")),
                rewrite=_str_or_none(data.get("rewrite")),
                policy=_str_or_none(data.get("policy")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SampleFormatError(f"not a valid sample: {exc!r}") from exc
        sample.validate()
        return sample

    def validate(self) -> None:
        """Check the invariants every sample keeps; `SampleFormatError` names the first broken one."""
        n = self.token_ids.shape[0]
        if self.token_ids.ndim != 1 or self.loss_mask.shape != (n,):
            raise SampleFormatError(
                f"sample {self.sample_id}: loss_mask length != token_ids length"
            )
        if self.logprobs is not None and self.logprobs.shape != (n,):
            raise SampleFormatError(f"sample {self.sample_id}: logprobs length != token_ids length")
        if self.policy_logprobs is not None and self.policy_logprobs.shape != (n,):
            raise SampleFormatError(
                f"sample {self.sample_id}: policy_logprobs length != token_ids length"
            )
        if n and (int(self.loss_mask.max()) > 1):
            raise SampleFormatError(
                f"sample {self.sample_id}: loss_mask holds values other than 0/1"
            )
        if self.reward is not None and not isinstance(self.reward, int | float):
            raise SampleFormatError(f"sample {self.sample_id}: reward is not a number")
        if self.view not in VIEWS:
            raise SampleFormatError(
                f"sample {self.sample_id}: view is {self.view!r}, not one of {list(VIEWS)}"
            )
        if self.segment_index is not None and self.segment_index < 0:
            raise SampleFormatError(f"sample {self.sample_id}: segment_index is negative")
        for span in self.spans:
            if not 0 <= span.context_start <= span.start <= span.end <= n:
                raise SampleFormatError(
                    f"sample {self.sample_id}: span {span.call_id} out of range"
                )


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def view_of(view: Any, start_reason: Any) -> SampleView:
    """A stored sample's view: the `view` field when present, else what its `start_reason`
    implies (files written before the field existed; per-call samples start with "call")."""
    if view is None:
        return "per_call" if start_reason in (None, "call") else "merged"
    if view not in VIEWS:
        raise SampleFormatError(f"view is {view!r}, not one of {list(VIEWS)}")
    return cast(SampleView, view)


def id_array(value: Any, what: str) -> npt.NDArray[np.int32]:
    """A stored id list as int32, refusing what capture refuses: booleans (`true` is not id 1),
    floats, strings and ids outside [0, 2**31), which `np.asarray(value, dtype=np.int32)` would
    turn into 1, 1 (from 1.5), 2 (from "2")... `SampleFormatError` names the field.

    Costs what that one numpy call cost: numpy infers the type (a float or a string makes the
    array non-integer), and only the few positions holding 0 or 1 are checked for booleans in
    Python (numpy reads `true` as 1 in a list of ints)."""
    if isinstance(value, np.ndarray) and value.dtype == np.int32:
        return value  # already typed (the binary codecs)
    if not isinstance(value, list | np.ndarray):
        raise SampleFormatError(f"{what} is {type(value).__name__}, expected a list of ints")
    if len(value) == 0:
        return np.zeros(0, dtype=np.int32)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise SampleFormatError(f"{what} holds values that are not integers") from None
    if array.dtype.kind == "b":
        raise SampleFormatError(f"{what} holds booleans (true/false), not token ids")
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise SampleFormatError(f"{what} holds values that are not integers")
    if int(array.min()) < 0 or int(array.max()) > _MAX_ID:
        raise SampleFormatError(f"{what} holds ids outside [0, 2**31)")
    if isinstance(value, list) and any(
        type(value[i]) is bool for i in np.flatnonzero(array <= 1).tolist()
    ):
        raise SampleFormatError(f"{what} holds booleans (true/false), not token ids")
    return array.astype(np.int32)


def trajectory_id_for(episode_id: str, agent: str | None) -> str:
    """The deterministic id of one agent's trajectory in one episode (agent None and "" differ)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(episode_id.encode())
    digest.update(b"\x02" if agent is None else b"\x03" + agent.encode())
    return digest.hexdigest()


def sample_id_for(episode_id: str, call_ids: list[str], salt: str = "") -> str:
    """A deterministic id: the same calls of the same episode always give the same sample id."""
    # the id hashes `episode_id`, then "\x00" + each call id, then "\x01" + the salt if any,
    # UTF-8 encoded: one text, encoded and hashed at once
    text = "\x00".join([episode_id, *call_ids])
    if salt:
        text += "\x01" + salt
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def finite_or_none(value: float | None) -> float | None:
    """Rewards must be finite numbers; NaN/inf are refused early rather than trained on."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"reward must be finite, got {value}")
    return value
