"""Re-scoring: the policy's own logprobs of ids sampled through a grammar mask, or returned
without logprobs.

vLLM samples a forced tool choice or a structured output through a grammar mask and returns the
logprobs of the *masked* distribution: up to 15 nats away from what a trainer recomputes, so PPO/GRPO
importance ratios on those tokens are meaningless. And vLLM 0.32's Responses API returns no logprobs
for output tokens its parsers turned into function calls or reasoning, nor (in a stream) for the
EOS: such a call has exact ids and `logprobs=None`, and a merged sample holding it none at all.
When the collector is asked to (`Collector(rescore_constrained=True)`), each constrained call, and
each Responses call that asked for logprobs and came back without them for every sampled id, has
its `prompt + sampled` ids sent back to the same server at the episode's end as a token prompt of
`/v1/completions` with `prompt_logprobs=0` (one generated token, greedy: nothing is sampled that
matters), and the logprob the free model gives each sampled id is stored in
`Call.policy_logprobs` (its spans say `logprob_source="rescored"`; the rollout `logprobs` stay as
vLLM returned them, never filled). Nothing is ever guessed: a call the server cannot re-score
keeps its flag and `Call.rescore_error` says why.

Sans-IO: `plan` groups calls into batched requests and `apply` reads an answer; `rescore` (sync,
a `Client` of the HTTP library `tito_agents._http` picks) and `arescore` (async) only do
the I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tito_agents._http import http_module
from tito_agents.calls import Call, CallStatus, ScoringEndpoint

logger = logging.getLogger("tito_agents")

BATCH_SIZE = 16
"""Prompts per re-scoring request (vLLM schedules them together)."""
TIMEOUT_S = 120.0


@dataclass(slots=True)
class RescoreRequest:
    """One batched `/completions` request re-scoring `calls` (same server, same model)."""

    endpoint: ScoringEndpoint
    calls: list[Call]
    body: bytes


def wanted(calls: Iterable[Call]) -> list[Call]:
    """Complete calls that carry a scoring endpoint and no policy logprobs yet, and are either
    constrained or lack a rollout logprob for some sampled id."""
    return [
        c
        for c in calls
        if c.status is CallStatus.COMPLETE
        and c.scoring is not None
        and c.policy_logprobs is None
        and c.num_sampled > 0
        and (c.constrained is not None or not has_rollout_logprobs(c))
    ]


def has_rollout_logprobs(call: Call) -> bool:
    """Whether the server returned a logprob for every sampled id of `call`."""
    lp = call.logprobs
    return lp is not None and lp.shape == call.sampled_ids.shape


def plan(calls: Iterable[Call], batch_size: int = BATCH_SIZE) -> list[RescoreRequest]:
    """Batched requests for `calls` (see `wanted`), grouped by server and model."""
    groups: dict[tuple[ScoringEndpoint, str | None], list[Call]] = {}
    for call in wanted(calls):
        assert call.scoring is not None
        groups.setdefault((call.scoring, call.model), []).append(call)
    requests = []
    for (endpoint, model), group in groups.items():
        for i in range(0, len(group), batch_size):
            chunk = group[i : i + batch_size]
            requests.append(RescoreRequest(endpoint, chunk, request_body(model, chunk)))
    return requests


def request_body(model: str | None, calls: list[Call]) -> bytes:
    """A `/completions` body scoring each call's `prompt + sampled` ids as a token prompt."""
    return orjson.dumps(
        {
            "model": model,
            "prompt": [c.token_ids for c in calls],  # numpy arrays: no Python int lists
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "return_token_ids": False,
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def apply(
    request: RescoreRequest, status: int | None, body: bytes, error: str | None = None
) -> int:
    """Store the policy logprobs an answer holds on each call of `request`, or the reason it has
    none (`Call.rescore_error`). Returns how many calls got their logprobs."""
    if error is None and status != 200:
        error = f"the server answered HTTP {status}: {_excerpt(body)}"
    choices = None
    if error is None:
        try:
            choices = orjson.loads(body)["choices"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            error = "the server's answer is not a completions response"
    if error is None and (not isinstance(choices, list) or len(choices) != len(request.calls)):
        error = "the server answered a different number of prompts"
    if error is not None:
        for call in request.calls:
            call.rescore_error = error
        return 0
    assert isinstance(choices, list)
    by_index = {c.get("index"): c for c in choices if isinstance(c, dict)}
    done = 0
    for i, call in enumerate(request.calls):
        result = _policy_logprobs(call, by_index.get(i))
        if isinstance(result, str):
            call.rescore_error = result
        else:
            call.policy_logprobs, call.rescore_error = result, None
            done += 1
    return done


def _policy_logprobs(call: Call, choice: object) -> np.ndarray | str:
    """The logprob of each sampled id in `choice["prompt_logprobs"]`, or why there is none."""
    if not isinstance(choice, dict):
        return "the server's answer lacks this prompt"
    entries = choice.get("prompt_logprobs")
    n_prompt = int(call.prompt_ids.shape[0])
    total = n_prompt + call.num_sampled
    if not isinstance(entries, list) or len(entries) != total:
        return "the server returned no prompt_logprobs for every token (needs vLLM >= 0.10.2)"
    if n_prompt == 0:
        return "the first sampled token has no context to be scored in"
    out = np.empty(call.num_sampled, dtype=np.float32)
    for j, token in enumerate(call.sampled_ids.tolist()):
        entry = entries[n_prompt + j]
        scored = entry.get(str(token)) if isinstance(entry, dict) else None
        value = scored.get("logprob") if isinstance(scored, dict) else None
        if not isinstance(value, int | float) or isinstance(value, bool):
            return f"no prompt logprob for sampled token {token} at position {n_prompt + j}"
        out[j] = value
    return out


def _excerpt(body: bytes) -> str:
    return body[:200].decode("utf-8", "replace")


def _split(request: RescoreRequest) -> list[RescoreRequest]:
    """One request per call: a refused batch is retried call by call, so one call the server
    refuses (e.g. at the model's length limit) does not cost the others their logprobs."""
    if len(request.calls) == 1:
        return []
    model = request.calls[0].model
    return [RescoreRequest(request.endpoint, [c], request_body(model, [c])) for c in request.calls]


def _answered(request: RescoreRequest, response: Any) -> tuple[int, list[RescoreRequest]]:
    """Apply an answer (a response, or the transport error raised instead) to `request`'s calls,
    shared by both runners: how many got logprobs, and the per-call retries of a refused batch."""
    if isinstance(response, Exception):
        apply(request, None, b"", f"re-scoring request failed: {response!r}")
        return 0, []
    got = apply(request, response.status_code, response.content)
    refused = got == 0 and response.status_code >= 400
    return got, _split(request) if refused else []


def _post_kwargs(request: RescoreRequest) -> dict[str, object]:
    headers = {"content-type": "application/json", **dict(request.endpoint.headers)}
    return {"content": request.body, "headers": headers}


def rescore(calls: Iterable[Call], *, timeout: float = TIMEOUT_S) -> int:
    """Re-score the calls among `calls` that need it (`wanted`; blocking). Returns how many got
    logprobs."""
    pending = plan(calls)
    if not pending:
        return 0
    done = 0
    http = http_module()
    client: Any
    with http.Client(timeout=timeout) as client:
        while pending:
            request = pending.pop(0)
            try:
                response = client.post(request.endpoint.url, **_post_kwargs(request))
            except http.HTTPError as exc:
                response = exc
            got, retry = _answered(request, response)
            pending[:0] = retry
            done += got
    return done


async def arescore(calls: Iterable[Call], *, timeout: float = TIMEOUT_S) -> int:
    """`rescore` on the event loop: the batched requests run concurrently."""
    import asyncio

    pending = plan(calls)
    if not pending:
        return 0
    http = http_module()
    client: Any
    async with http.AsyncClient(timeout=timeout) as client:

        async def one(request: RescoreRequest) -> int:
            try:
                response = await client.post(request.endpoint.url, **_post_kwargs(request))
            except http.HTTPError as exc:
                response = exc
            got, retry = _answered(request, response)
            return got + sum(await asyncio.gather(*(one(r) for r in retry)))

        return sum(await asyncio.gather(*(one(r) for r in pending)))
