"""Generated Anthropic Messages requests and chat completion answers for the differential test of
`_wire.messages_chat` / `_wire.messages_reply` against vLLM's own conversions
(tests/support/vllm_anthropic_oracle.py). Seeded: the same cases every run.

The requests mix what agents send (Claude Code: system blocks with a billing header, inline system
messages, tool_use / tool_result turns, thinking, metadata, cache_control) with what vLLM refuses
or converts oddly (bad roles and blocks, lax types, empty tools, tool_choice without tools).
The chat answers and streams follow what vLLM's chat endpoint emits (role chunk with continuous
usage, content / reasoning / tool-call deltas, empty deltas carrying only token ids, the finish
chunk, the usage chunk) plus shapes a parser may produce (interleaved parallel calls, text inside a
tool call, arguments cut by a stop string).
"""

from __future__ import annotations

import json
import random
from typing import Any

_WORDS = ["hi", "héllo", "x-anthropic-billing-header: cc=1", "", "a\nb", '{"q": 1}', "ok 🙂"]


def _text(rng: random.Random) -> str:
    return rng.choice(_WORDS) + rng.choice(["", " more", str(rng.randint(0, 99))])


def _source(rng: random.Random) -> Any:
    return rng.choice(
        [
            {"type": "base64", "media_type": "image/png", "data": "AAAA"},
            {"type": "url", "url": "https://example.com/a.png"},
            {"data": "BBBB"},
            {},
        ]
    )


def _tool_result_content(rng: random.Random) -> Any:
    items = [
        {"type": "text", "text": _text(rng)},
        {"type": "image", "source": _source(rng)},
        {"type": "tool_reference", "tool_name": "f"},
        {"type": "tool_reference", "name": "g"},
        {"type": "other", "x": 1},
    ]
    return rng.choice([None, "", _text(rng), rng.sample(items, rng.randint(0, 4))])


def _block(rng: random.Random, tools: list[str]) -> dict[str, Any]:
    kind = rng.choice(
        ["text", "text", "image", "thinking", "redacted_thinking", "tool_use", "tool_result"]
        + ["tool_reference"]
    )
    block: dict[str, Any] = {"type": kind}
    if kind == "text":
        block["text"] = _text(rng)
    elif kind == "image":
        block["source"] = _source(rng)
    elif kind == "thinking":
        block.update(thinking=_text(rng), signature="s")
    elif kind == "redacted_thinking":
        block["data"] = "opaque"
    elif kind == "tool_use":
        block.update(id=f"toolu_{rng.randint(0, 9)}", name=rng.choice([*tools, "f"]))
        block["input"] = rng.choice([{}, {"city": "Paris"}, {"n": 1.5, "l": [1, None]}])
    elif kind == "tool_result":
        block.update(tool_use_id=f"toolu_{rng.randint(0, 9)}", content=_tool_result_content(rng))
        if rng.random() < 0.3:
            block["is_error"] = True
    else:
        block["tool_name"] = "f"
    if rng.random() < 0.2:
        block["cache_control"] = {"type": "ephemeral"}
    return block


def _tool(rng: random.Random, name: str) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": name, "input_schema": rng.choice([{}, {"type": "object"}])}
    if rng.random() < 0.5:
        tool["input_schema"] = {"properties": {"city": {"type": "string"}}, "required": ["city"]}
    if rng.random() < 0.6:
        tool["description"] = "does " + name
    for key in ("strict", "defer_loading"):
        if rng.random() < 0.2:
            tool[key] = rng.random() < 0.5
    return tool


def _message(rng: random.Random, role: str, tools: list[str]) -> dict[str, Any]:
    if rng.random() < 0.3:
        return {"role": role, "content": _text(rng)}
    blocks = [_block(rng, tools) for _ in range(rng.randint(0, 4))]
    if role == "system" and rng.random() < 0.3:
        change = rng.choice(
            [
                {"type": "tool_reference", "name": rng.choice([*tools, "zz"])},
                {"type": "tool_definition", "definition": _tool(rng, "added")},
            ]
        )
        blocks.append({"type": rng.choice(["tool_addition", "tool_removal"]), "tool": change})
    return {"role": role, "content": blocks}


_BREAKERS: list[tuple[str, Any]] = [
    ("max_tokens", 0),
    ("max_tokens", "8"),
    ("max_tokens", None),
    ("model", ""),
    ("temperature", "0.5"),
    ("stream", "yes"),
    ("stop_sequences", ["a", "b", "c", "d", "e"]),
    ("tools", []),
    ("tool_choice", {"type": "tool"}),
    ("tool_choice", {"type": "sometimes"}),
    ("thinking", {"type": "enabled", "budget_tokens": 100}),
    ("thinking", {"type": "enabled", "budget_tokens": 5000}),
    ("messages", [{"role": "tool", "content": "x"}]),
    ("messages", [{"role": "user", "content": [{"type": "document", "source": {}}]}]),
    ("messages", [{"role": "user", "content": [{"type": "text", "text": 5}]}]),
    ("cache_salt", ""),
    ("mm_payload", "all"),
]


def request(rng: random.Random) -> dict[str, Any]:
    """One Messages request (some refused by vLLM)."""
    names = rng.sample(["f", "g", "get_weather"], rng.randint(0, 3))
    payload: dict[str, Any] = {"model": "m", "max_tokens": rng.choice([16, 2048, 8192])}
    roles = ["user", "assistant", "system", "user"]
    payload["messages"] = [
        _message(rng, rng.choice(roles), names) for _ in range(rng.randint(1, 5))
    ]
    if rng.random() < 0.5:
        payload["system"] = rng.choice(
            [_text(rng), [{"type": "text", "text": _text(rng)} for _ in range(rng.randint(0, 3))]]
        )
    if names or rng.random() < 0.1:
        payload["tools"] = [_tool(rng, name) for name in names]
    if rng.random() < 0.4:
        choice: dict[str, Any] = {"type": rng.choice(["auto", "any", "none", "tool"])}
        if choice["type"] == "tool":
            choice["name"] = rng.choice([*names, "nope"])
        if rng.random() < 0.4:
            choice["disable_parallel_tool_use"] = rng.random() < 0.5
        payload["tool_choice"] = choice
    optional: list[tuple[str, Any]] = [
        ("stream", rng.random() < 0.5),
        ("stop_sequences", ["\n\n", "END"]),
        ("temperature", rng.choice([0, 0.7, 1])),
        ("top_p", 0.9),
        ("top_k", 20),
        ("metadata", {"user_id": "u"}),
        (
            "thinking",
            rng.choice([{"type": "disabled"}, {"type": "adaptive", "display": "omitted"}]),
        ),
        ("thinking", {"type": "enabled", "budget_tokens": 1024}),
        ("output_config", {"effort": rng.choice(["low", "high", "max"])}),
        ("output_config", {"format": {"type": "json_schema", "schema": {"type": "object"}}}),
        ("context_management", {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
        ("chat_template_kwargs", {"enable_thinking": False}),
        ("vllm_xargs", {"k": [1, "a"]}),
        ("cache_salt", "salt"),
        ("stream", None),
    ]
    for key, value in rng.sample(optional, rng.randint(0, 5)):
        payload[key] = value
    if rng.random() < 0.15:
        key, value = rng.choice(_BREAKERS)
        payload[key] = value
    return payload


def _call(rng: random.Random, index: int) -> dict[str, Any]:
    arguments = rng.choice(['{"city": "Paris"}', "{}", "null", "[1]", '{"a": ', '{"x": null}'])
    function = {"name": rng.choice(["f", "get_weather"]), "arguments": arguments}
    return {"id": f"chatcmpl-tool-{index:016x}", "type": "function", "function": function}


def _usage(rng: random.Random, prompt: int, completion: int | None) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + (completion or 0)}
    usage["completion_tokens"] = completion
    if rng.random() < 0.2:
        usage["prompt_tokens_details"] = rng.choice(
            [{"cached_tokens": 4}, {"cached_tokens": None, "created_cache_tokens": 2}, {}]
        )
    return usage


_FINISH = [("stop", None), ("stop", 2), ("stop", "END"), ("length", None), ("tool_calls", None)]
_FINISH += [("abort", None), (None, None)]


def response(rng: random.Random) -> dict[str, Any]:
    """One non-streamed chat completion body as vLLM 0.32 writes it."""
    message: dict[str, Any] = {"role": "assistant", "content": rng.choice([None, "", _text(rng)])}
    message["reasoning"] = rng.choice([None, "", "because"])
    if rng.random() < 0.5:
        message["tool_calls"] = [_call(rng, i) for i in range(rng.randint(1, 2))]
    finish, stop = rng.choice(_FINISH)
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    choice.update(stop_reason=stop, token_ids=[5, 6])
    body: dict[str, Any] = {"id": "chatcmpl-abc", "object": "chat.completion", "created": 1}
    body.update(model="m", choices=[choice], usage=_usage(rng, 20, rng.randint(0, 9)))
    body.update(prompt_token_ids=[1, 2], kv_transfer_params=rng.choice([None, {"k": 1}]))
    return body


def _chunk(choices: list[Any], **extra: Any) -> dict[str, Any]:
    chunk = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return {**chunk, "choices": choices, **extra}


def _delta(rng: random.Random, calls: list[int]) -> dict[str, Any]:
    kind = rng.choice(["content", "content", "reasoning", "call", "args", "empty", "both"])
    if kind == "content":
        return {"content": rng.choice(["", "Hi", " there", "é"])}
    if kind == "reasoning":
        return {"reasoning": rng.choice(["", "think", " more"])}
    if kind == "both":
        return {"reasoning": "r", "content": "c"}
    if kind == "call":
        index = len(calls) if rng.random() < 0.8 or not calls else calls[-1]
        calls.append(index)
        call = {"id": f"chatcmpl-tool-{index:x}{rng.randint(0, 1)}", "type": "function"}
        function = {"name": rng.choice(["f", None]), "arguments": rng.choice(["", '{"a": '])}
        return {"tool_calls": [{**call, "index": index, "function": function}]}
    if kind == "args" and calls:
        index = rng.choice([*calls, 7])
        function = {"arguments": rng.choice(["1}", '"x"', "", "}"])}
        return {"tool_calls": [{"index": index, "function": function}]}
    return {}


def stream(rng: random.Random) -> list[dict[str, Any]]:
    """One chat completion stream as vLLM 0.32 sends it for a Messages request (parsed chunks)."""
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
    chunks = [_chunk([{**role, "finish_reason": None}], usage=_usage(rng, 20, 0))]
    calls: list[int] = []
    for step in range(rng.randint(0, 8)):
        choice = {"index": 0, "delta": _delta(rng, calls), "logprobs": None, "finish_reason": None}
        choice["token_ids"] = [step]
        chunks.append(_chunk([choice], usage=_usage(rng, 20, step + 1)))
    if rng.random() < 0.9:
        finish, stop = rng.choice(_FINISH)
        choice = {"index": 0, "delta": _delta(rng, calls), "logprobs": None}
        choice.update(finish_reason=finish or "stop", stop_reason=stop, token_ids=[2])
        chunks.append(_chunk([choice]))
    if rng.random() < 0.9:
        chunks.append(_chunk([], usage=_usage(rng, 20, 9)))
    if rng.random() < 0.03:
        chunks.insert(rng.randint(1, len(chunks)), {"error": {"message": "boom", "code": 500}})
    return chunks


def capture_streams(text: str) -> list[list[dict[str, Any]]]:
    """The chat streams of a reference capture file (its `data:` lines, `[DONE]` left out)."""
    streams: list[list[dict[str, Any]]] = [[]]
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            streams[-1].append(json.loads(line[6:]))
        elif line == "data: [DONE]":
            streams.append([])
    return [s for s in streams if s]
