"""The free model's logprobs of a sample, asked of the fake vLLM server directly: the independent
check of what re-scoring recorded."""

from __future__ import annotations

import numpy as np

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME


def rescore_independently(server: FakeVLLMServer, sample: tito.Sample) -> np.ndarray:
    """The free model's logprob of every token of `sample`, from the server's prompt scoring."""
    import httpx

    body = {
        "model": MODEL_NAME,
        "prompt": sample.token_ids.tolist(),
        "max_tokens": 1,
        "prompt_logprobs": 0,
    }
    answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=30).json()
    entries = answer["choices"][0]["prompt_logprobs"]
    out = np.zeros(sample.num_tokens, dtype=np.float32)
    for i, (token, entry) in enumerate(zip(sample.token_ids.tolist(), entries, strict=True)):
        if entry is not None:
            out[i] = entry[str(token)]["logprob"]
    return out
