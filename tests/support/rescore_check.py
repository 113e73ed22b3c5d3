"""Independent exactness check: re-score a sample on the server and compare rollout logprobs.

`/v1/completions` with the sample's token ids as the prompt, `max_tokens: 1` and
`prompt_logprobs: 0` returns the logprob of every prompt token given the tokens before it. For a
sample whose trained tokens are exactly what the engine sampled, these equal the captured rollout
logprobs up to bf16 noise; a retokenized sample shows large gaps where it drifted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

import tito_agents as tito


@dataclass
class Rescore:
    mean_abs: float
    max_abs: float
    tokens: int


def rescored_logprobs(base_url: str, model: str, token_ids: list[int]) -> np.ndarray:
    """Logprob of each token given its prefix (position 0 has none: NaN)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 0,
    }
    response = httpx.post(f"{base_url.rstrip('/')}/completions", json=body, timeout=300)
    response.raise_for_status()
    entries = response.json()["choices"][0]["prompt_logprobs"]
    out = np.full(len(token_ids), np.nan, dtype=np.float64)
    for i, (tok, entry) in enumerate(zip(token_ids, entries, strict=True)):
        if entry is not None:
            out[i] = entry[str(tok)]["logprob"]
    return out


def constrained(call: tito.Call) -> bool:
    """Whether vLLM decoded the call under a grammar (forced tool choice, structured outputs).

    vLLM computes rollout logprobs after applying the grammar mask, so those logprobs are of the
    masked distribution and a free re-scoring cannot reproduce them; ids stay exact either way.
    """
    choice = call.sampling.get("tool_choice")
    forced = choice == "required" or isinstance(choice, dict)
    return forced or any(
        k in call.sampling for k in ("response_format", "structured_outputs", "guided_json")
    )


def rescore_sample(
    base_url: str,
    model: str,
    sample: tito.Sample,
    skip_calls: set[str] | None = None,
    *,
    policy: bool = False,
) -> Rescore:
    """Compare a sample's rollout logprobs (with `policy`, the logprobs a trainer takes as the old
    policy's, `Sample.ratio_logprobs`) with the server's re-scoring on its trained tokens (leaving
    out the spans of `skip_calls`, e.g. grammar-constrained calls)."""
    stored = sample.ratio_logprobs() if policy else sample.logprobs
    assert stored is not None, "sample has no rollout logprobs"
    again = rescored_logprobs(base_url, model, sample.token_ids.tolist())
    trained = sample.loss_mask.astype(bool)
    for span in sample.spans:
        if skip_calls and span.call_id in skip_calls:
            trained[span.start : span.end] = False
    if not trained.any():
        return Rescore(0.0, 0.0, 0)
    diff = np.abs(again[trained] - stored[trained].astype(np.float64))
    return Rescore(float(diff.mean()), float(diff.max()), int(trained.sum()))
