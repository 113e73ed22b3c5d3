"""Record the Responses API captures in tests/data/real_vllm/responses_*.txt from a running real
vLLM (`python3 scripts/vllm_server.py start`; TITO_VLLM_PORT, default 8765).

Same file format as the other captures: `POST <path>`, `REQUEST: <json>`, `STATUS: <code>`, a blank
line, the body exactly as received. Greedy sampling, so a re-recording gives the same ids.
`--store` records the two `responses_store_*` captures from a server started with
VLLM_ENABLE_RESPONSES_API_STORE=1 (on another port: TITO_VLLM_PORT)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "real_vllm"
MODEL = "SmolLM2-135M-Instruct"
LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 0}
IDS = {"enable_response_messages": True}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
}
ASK = "What is the weather in Paris?"
CALL = {
    "type": "function_call",
    "call_id": "call_0",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
}
RESULT = {"type": "function_call_output", "call_id": "call_0", "output": "18 degrees, sunny"}

CASES: dict[str, dict[str, object]] = {
    "responses_ns": {
        "input": "Reply with one word: yes or no?",
        "instructions": "Be terse.",
        "max_output_tokens": 30,
        **IDS,
        **LOGPROBS,
    },
    "responses_ns_plain": {
        "input": "Reply with one word: yes or no?",
        "instructions": "Be terse.",
        "max_output_tokens": 30,
    },
    "responses_incomplete": {"input": "Say hello.", "max_output_tokens": 5, **IDS, **LOGPROBS},
    "responses_stream": {
        "input": "Say hello.",
        "max_output_tokens": 12,
        "stream": True,
        **IDS,
        **LOGPROBS,
    },
    "responses_stream_eos": {
        "input": "Say hello to Ada.",
        "max_output_tokens": 20,
        "temperature": 1.0,
        "seed": 130,
        "stream": True,
        **IDS,
        **LOGPROBS,
    },
    "responses_tool_required": {
        "input": ASK,
        "tools": [TOOL],
        "tool_choice": "required",
        "max_output_tokens": 60,
        **IDS,
        **LOGPROBS,
    },
    "responses_tool_required_stream": {
        "input": ASK,
        "tools": [TOOL],
        "tool_choice": "required",
        "max_output_tokens": 60,
        "stream": True,
        **IDS,
        **LOGPROBS,
    },
    "responses_tool_auto": {
        "input": ASK,
        "tools": [TOOL],
        "max_output_tokens": 40,
        **IDS,
        **LOGPROBS,
    },
    "responses_multi_turn_tool": {
        "input": [{"role": "user", "content": ASK}, CALL, RESULT],
        "instructions": "You are a helpful assistant.",
        "tools": [TOOL],
        "max_output_tokens": 40,
        **IDS,
        **LOGPROBS,
    },
    "responses_store_false": {
        "input": "Say hello.",
        "store": False,
        "max_output_tokens": 4,
        **IDS,
        **LOGPROBS,
    },
    "responses_previous_id": {
        "input": "And again.",
        "previous_response_id": "resp_0123456789abcdef",
        "max_output_tokens": 4,
        **IDS,
    },
    "responses_err_validation": {"input": "Say hello.", "max_output_tokens": -1, **IDS},
    "responses_err_model": {"model": "no-such-model", "input": "Say hello.", **IDS},
}


STORED = {
    "responses_store_first": {"input": "Say hello.", "store": True, "max_output_tokens": 6, **IDS},
    "responses_store_followup": {"input": "And again.", "max_output_tokens": 6, **IDS},
}
"""`--store`: a server started with VLLM_ENABLE_RESPONSES_API_STORE=1; the follow-up names the
first response in `previous_response_id`."""


def record(client: httpx.Client, name: str, case: dict[str, object]) -> dict[str, object] | None:
    request = {"model": MODEL, "temperature": 0, **case}
    with client.stream("POST", "/v1/responses", json=request) as response:
        body = response.read()
    head = f"POST /v1/responses\nREQUEST: {json.dumps(request)}\nSTATUS: {response.status_code}\n\n"
    (OUT / f"{name}.txt").write_bytes(head.encode() + body)
    print(name, response.status_code, len(body))
    return json.loads(body) if not case.get("stream") else None


def main() -> None:
    base = f"http://127.0.0.1:{os.environ.get('TITO_VLLM_PORT', '8765')}"
    args = sys.argv[1:]
    with httpx.Client(base_url=base, timeout=300) as client:
        if args == ["--store"]:
            first = record(client, "responses_store_first", STORED["responses_store_first"])
            assert first is not None
            followup = {**STORED["responses_store_followup"], "previous_response_id": first["id"]}
            record(client, "responses_store_followup", followup)
            return
        for name in args or list(CASES):
            record(client, name, CASES[name])


if __name__ == "__main__":
    main()
