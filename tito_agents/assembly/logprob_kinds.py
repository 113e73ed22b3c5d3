"""How each span's logprobs were sampled, and the policy logprobs of a sample (shared by the
per-call and merged assemblers).

vLLM returns, for a call sampled under a constraint (forced tool choice, structured output), the
logprobs of the grammar-masked distribution, and for some Responses calls none at all (tokens that
became function calls or reasoning); re-scoring (`tito_agents.rescore`) recovers the policy's own.
A sample says which kind each span holds and, when some span was re-scored, carries the policy's
logprob on every trained token in `Sample.policy_logprobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tito_agents.calls import Call, LogprobArray
from tito_agents.sampling import span_sampling

POLICY = "policy"
MASKED = "masked"
RESCORED = "rescored"


def logprob_source(call: Call) -> str | None:
    """What the call's logprobs are (see `CallSpan.logprob_source`): re-scored ones win (a
    constrained call's, or those of a call the server returned without logprobs)."""
    if _has_policy(call):
        return RESCORED
    if call.constrained is None:
        return POLICY if call.logprobs is not None else None
    return MASKED if call.logprobs is not None else None


def span_flags(call: Call) -> dict[str, Any]:
    """The `CallSpan` fields that say how the call was sampled: under which constraint, what its
    logprobs are, and the sampling parameters and logprobs mode the engine applied (the request's
    values with what the capture knows of the server: `tito_agents.sampling.span_sampling`)."""
    sampling, source, mode = span_sampling(call.sampling, call.server_sampling)
    return {
        "constrained": call.constrained,
        "logprob_source": logprob_source(call),
        "rescore_error": call.rescore_error,
        "sampling": sampling,
        "sampling_source": source,
        "logprobs_mode": mode,
    }


def policy_logprobs(total: int, placed: Sequence[tuple[int, Call]]) -> LogprobArray | None:
    """The policy's logprob on every trained token of a sample of `total` positions, where
    `placed` lists each call with the position of its first sampled token; None unless some call
    was re-scored and every call has policy logprobs (re-scored, or its free-sampling logprobs)."""
    for _, call in placed:
        if _has_policy(call):
            break
    else:  # the common case, checked call by call
        return None
    out = np.zeros(total, dtype=np.float32)
    for start, call in placed:
        if _has_policy(call):
            values = call.policy_logprobs
        else:  # free sampling: the rollout logprobs are the policy's (masked ones are not)
            values = call.logprobs if call.constrained is None else None
        if values is None or values.shape != call.sampled_ids.shape:
            return None
        out[start : start + call.num_sampled] = values
    return out


def _has_policy(call: Call) -> bool:
    lp = call.policy_logprobs
    return lp is not None and lp.shape == call.sampled_ids.shape
