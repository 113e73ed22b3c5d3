"""A vLLM-shaped server that answers instantly with pre-built bodies (the worst case for capture
overhead: nothing but the client's own work remains). Run as a separate process:

    python benchmarks/canned_server.py PORT PROMPT_TOKENS COMPLETION_TOKENS [EVENT_GAP_MS]

With EVENT_GAP_MS, a stream is sent as vLLM sends it: one HTTP chunk per SSE event, written and
drained one by one, EVENT_GAP_MS apart (0: only a yield to the event loop); without it, the whole
stream is one chunk.

POST .../chat/completions answers a vLLM 0.32 body with `return_token_ids` fields and logprobs:
an SSE stream (one event per token) when the request streams, else one JSON body; with logprob
entries when the request asks for logprobs. JSON bodies carry ids only when the request asks
(`return_token_ids`), as from vLLM; streams always carry them. Every response has its own id
(`chatcmpl-<16 hex digits>`, a counter; the chunks of one stream share it), as from vLLM: a
multi-call episode must not collapse into one sample because its calls look like one response.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys

RID = b"chatcmpl-0123456789abcdef"
"""The response id in the pre-built bodies; `Canned` swaps in a fresh one per response."""


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def build_bodies(
    prompt_tokens: int, completion_tokens: int, logprobs: bool = True
) -> tuple[bytes, bytes]:
    rng = random.Random(0)
    prompt = [rng.randrange(3, 49152) for _ in range(prompt_tokens)]
    sampled = [rng.randrange(3, 49152) for _ in range(completion_tokens - 1)] + [2]
    lps = [round(-rng.random() * 3, 6) for _ in sampled]
    rid = RID.decode()
    content = [
        {"token": f"t{t}", "logprob": lp, "bytes": [116], "top_logprobs": []}
        for t, lp in zip(sampled, lps, strict=True)
    ]
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "x" * len(sampled),
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "reasoning": None,
                },
                "logprobs": {"content": content} if logprobs else None,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": sampled,
                "routed_experts": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": "vllm-0.32.0-bench",
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(sampled),
            "completion_tokens": len(sampled),
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    events = [
        dumps(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "bench",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "prompt_token_ids": prompt,
                "prompt_text": None,
            }
        )
    ]
    for i, (tok, entry) in enumerate(zip(sampled, content, strict=True)):
        last = i == len(sampled) - 1
        choice = {
            "index": 0,
            "delta": {"content": "x"} if not last else {},
            "logprobs": {"content": [entry]} if logprobs else None,
            "finish_reason": "stop" if last else None,
        }
        if last:
            choice["stop_reason"] = None
        choice["token_ids"] = [tok]
        events.append(
            dumps(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "bench",
                    "choices": [choice],
                }
            )
        )
    events.append(
        dumps(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "bench",
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "total_tokens": len(prompt) + len(sampled),
                    "completion_tokens": len(sampled),
                },
            }
        )
    )
    sse = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return dumps(body), sse


def without_ids(body: bytes) -> bytes:
    """A JSON body as vLLM sends it to a request without `return_token_ids`."""
    payload = json.loads(body)
    payload["prompt_token_ids"] = None
    for choice in payload["choices"]:
        choice["token_ids"] = None
    return json.dumps(payload, separators=(",", ":")).encode()


class Canned:
    """A pre-built HTTP response, split where the response id goes, so each answer gets a fresh
    id with one join and no parsing (the id keeps its length, so the lengths in the head stay
    right)."""

    _ids = itertools.count()

    def __init__(self, response: bytes) -> None:
        self.parts = response.split(RID)

    def render(self) -> bytes:
        rid = b"chatcmpl-%016x" % next(self._ids)
        return rid.join(self.parts)


async def serve(
    port: int,
    json_body: bytes,
    sse_body: bytes,
    lp_json: bytes,
    lp_sse: bytes,
    event_gap_ms: float | None = None,
) -> None:
    sse_head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )

    def json_response(body: bytes) -> Canned:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        return Canned(head + str(len(body)).encode() + b"\r\n\r\n" + body)

    def sse_response(body: bytes) -> Canned:
        chunk = hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
        return Canned(sse_head + chunk)

    models = b'{"object":"list","data":[{"id":"bench","object":"model"}]}'
    models_resp = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(models)).encode()
        + b"\r\n\r\n"
        + models
    )

    # built once: the server's own time stays ~0 (a join per answer for the fresh id)
    streams = {False: sse_response(sse_body), True: sse_response(lp_sse)}
    event_chunks = {  # one HTTP chunk per event, for EVENT_GAP_MS
        lp: [
            hex(len(event) + 2)[2:].encode() + b"\r\n" + event + b"\n\n\r\n"
            for event in (lp_sse if lp else sse_body).split(b"\n\n")
            if event
        ]
        for lp in (False, True)
    }
    ids = itertools.count(1 << 40)

    async def send_events(writer: asyncio.StreamWriter, wants_lp: bool) -> None:
        rid = b"chatcmpl-%016x" % next(ids)
        writer.write(sse_head)
        for chunk in event_chunks[wants_lp]:
            writer.write(chunk.replace(RID, rid))
            await writer.drain()
            await asyncio.sleep((event_gap_ms or 0) / 1000)
        writer.write(b"0\r\n\r\n")

    bodies = {False: json_response(json_body), True: json_response(lp_json)}
    plain = json_response(without_ids(json_body))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                if head.startswith(b"GET"):
                    writer.write(models_resp)
                else:
                    compact = body.replace(b" ", b"")
                    wants_lp = b'"logprobs":true' in compact
                    if b'"stream":true' in compact and event_gap_ms is not None:
                        await send_events(writer, wants_lp)
                        await writer.drain()
                        continue
                    if b'"stream":true' in compact:
                        canned = streams[wants_lp]
                    elif b'"return_token_ids":true' in compact:
                        canned = bodies[wants_lp]
                    else:  # as vLLM: no ids unless asked (the keys stay, null)
                        canned = plain
                    writer.write(canned.render())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    port, prompt_tokens, completion_tokens = (int(a) for a in sys.argv[1:4])
    gap = float(sys.argv[4]) if len(sys.argv) > 4 else None
    json_body, sse_body = build_bodies(prompt_tokens, completion_tokens, logprobs=False)
    lp_json, lp_sse = build_bodies(prompt_tokens, completion_tokens, logprobs=True)
    asyncio.run(serve(port, json_body, sse_body, lp_json, lp_sse, gap))
