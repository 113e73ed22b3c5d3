"""A `Call` as tests need one: complete, chat, with the given ids and only the fields a test names.

One place for the dozen fields every hand-made call repeats (ids, status, timing, HTTP status), so a
test states only what it is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tito_agents.calls import Call, CallStatus, Endpoint


def make_call(
    call_id: str,
    prompt: Sequence[int],
    sampled: Sequence[int],
    *,
    logprob: float | None = None,
    **fields: Any,
) -> Call:
    """A complete chat call `call_id` ("<request id>/<choice>" or any string) of `prompt` and
    `sampled` ids; `logprob` fills one rollout logprob per sampled id (None: no logprobs);
    `fields` sets any other `Call` field (seq, agent, reward, messages, constrained, ...)."""
    values: dict[str, Any] = {
        "call_id": call_id,
        "request_id": call_id.split("/")[0],
        "endpoint": Endpoint.CHAT,
        "choice_index": 0,
        "status": CallStatus.COMPLETE,
        "prompt_ids": np.asarray(prompt, dtype=np.int32),
        "sampled_ids": np.asarray(sampled, dtype=np.int32),
        "logprobs": None if logprob is None else np.full(len(sampled), logprob, np.float32),
        "finish_reason": "stop",
        "stop_reason": None,
        "model": "m",
        "http_status": 200,
        "stream": False,
        "started_at": 0.0,
        "ended_at": 0.0,
    }
    values.update(fields)
    return Call(**values)
