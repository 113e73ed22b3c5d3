"""What the end-to-end tests against the real CPU vLLM share: one noise bound, one tool.

The served model runs in bf16 on the CPU; re-scoring the same ids on the same server gives
logprobs within that precision's noise of the captured ones (measured: mean |Δ| ~ 0.03 per
token, max ~ 0.1; a short answer's mean can reach ~0.055). Every e2e check of "the stored
logprobs are the server's own" uses these bounds, so a change of noise is one edit here.
The trainer check's figures (fp32 trainer vs bf16 server, `test_rl_step`) are a target of their
own and are not this bound.
"""

from __future__ import annotations

from typing import Any

import httpx

MEAN_TOL = 0.08
"""Mean |captured - re-scored| logprob over a call's or sample's trained tokens."""
MAX_TOL = 0.5
"""Largest |captured - re-scored| logprob of any single token."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
]
"""A strict weather tool: the forced call's grammar follows the schema, so a 135M model closes it."""

RESPONSES_TOOL: dict[str, Any] = {"type": "function", **TOOLS[0]["function"]}
"""The same tool in the Responses API's flat shape."""
INSTRUCTIONS = "You are a helpful assistant."
ASK = "What is the weather in Paris?"


def tokenize(base_url: str, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    """The server's own ids for a chat conversation (`/tokenize` with the generation prompt)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": True}
    if tools:
        body["tools"] = tools
    response = httpx.post(f"{root}/tokenize", json=body, timeout=60)
    response.raise_for_status()
    return list(response.json()["tokens"])
