"""Each fault switch of the fake, through the pure core (transport faults over HTTP in test_fake_server)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from tests.support.fake_vllm_calls import MESSAGES, WEATHER_TOOL, call, parse_sse, stream_token_ids
from tito_agents.testing import FakeConfig, FakeVLLM, Faults, StreamCut

CHAT = "/v1/chat/completions"


def _fake(**faults: Any) -> FakeVLLM:
    return FakeVLLM(FakeConfig(faults=Faults(**faults)))


def _request(**fields: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "return_token_ids": True, "max_tokens": 40, **fields}


def test_no_token_ids_removes_the_fields_like_old_servers() -> None:
    """no_token_ids: prompt_token_ids and token_ids keys are absent, in bodies and in chunks."""
    fake = _fake(no_token_ids=True)
    body = call(fake, CHAT, _request()).body
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    chunks = call(fake, CHAT, _request(stream=True)).chunks
    assert all("prompt_token_ids" not in c for c in chunks)
    assert all("token_ids" not in choice for c in chunks for choice in c["choices"])
    cmpl = call(fake, "/v1/completions", {"prompt": "hi", "return_token_ids": True}).body
    assert "token_ids" not in cmpl["choices"][0] and "prompt_token_ids" not in cmpl["choices"][0]


def test_include_reasoning_nulls_hides_ids_and_logprobs() -> None:
    """include_reasoning_nulls: include_reasoning=false nulls token_ids and logprobs, not prompt ids."""
    fake = _fake(include_reasoning_nulls=True)
    fields = _request(include_reasoning=False, logprobs=True)
    choice = call(fake, CHAT, fields).body["choices"][0]
    assert choice["token_ids"] is None and choice["logprobs"] is None
    assert call(fake, CHAT, fields).body["prompt_token_ids"]
    chunks = call(fake, CHAT, {**fields, "stream": True}).chunks
    assert all(c["choices"][0].get("token_ids") is None for c in chunks)
    assert chunks[1]["choices"][0]["delta"] == {"content": "Good", "reasoning": None}
    assert call(fake, CHAT, _request(logprobs=True)).body["choices"][0]["token_ids"]
    off = call(FakeVLLM(), CHAT, fields).body["choices"][0]
    assert off["token_ids"] and off["logprobs"]


def test_drop_parser_chunks_loses_markup_ids() -> None:
    """drop_parser_chunks: streamed ids of tool markup are lost, so they no longer add up to usage."""
    fields = _request(tools=[WEATHER_TOOL], stream=True, stream_options={"include_usage": True})
    for fake, lossy in ((FakeVLLM(), False), (_fake(drop_parser_chunks=True), True)):
        chunks = call(fake, CHAT, fields).chunks
        streamed = sum(len(ids) for ids in stream_token_ids(chunks).values())
        assert (streamed < chunks[-1]["usage"]["completion_tokens"]) is lossy


def test_length_mismatch_drops_the_last_id_only() -> None:
    """length_mismatch: token_ids lose one id while logprobs and usage keep counting it."""
    fake = _fake(length_mismatch=True)
    body = call(fake, CHAT, _request(logprobs=True)).body
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) - 1
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"] - 1
    chunks = call(fake, CHAT, _request(stream=True, stream_options={"include_usage": True})).chunks
    streamed = sum(len(ids) for ids in stream_token_ids(chunks).values())
    assert streamed == chunks[-1]["usage"]["completion_tokens"] - 1


def test_cut_stream_after_raises_stream_cut() -> None:
    """cut_stream_after=N: the event iterator yields N events, then raises StreamCut (no [DONE])."""
    response = _fake(cut_stream_after=3).handle(
        "POST", CHAT, json.dumps(_request(stream=True)).encode()
    )

    async def drain() -> list[bytes]:
        events = []
        assert response.stream is not None
        with pytest.raises(StreamCut):
            async for event in response.stream:
                events.append(event)
        return events

    events = asyncio.run(drain())
    assert len(events) == 3 and b"[DONE]" not in b"".join(events)


def test_status_before_body_counts_down_and_then_serves() -> None:
    """status_before_body: the next K requests get the status and an error body, then 200s."""
    fake = FakeVLLM()
    fake.fail_next(2, status=429, retry_after_ms=5)
    first = call(fake, CHAT, _request())
    assert first.status == 429 and first.headers["retry-after-ms"] == "5"
    assert first.body["error"]["code"] == 429
    assert call(fake, CHAT, _request()).status == 429
    assert call(fake, CHAT, _request()).status == 200
    assert fake.stats[CHAT] == 3 and fake.stats.statuses[429] == 2
    assert (
        call(
            fake, "/tokenize", {"prompt": "x"}, headers={"x-fake-fault": "status_before_body=503"}
        ).status
        == 200
    )


def test_latency_and_token_latency() -> None:
    """latency_ms delays the response; token_latency_ms spaces the streamed events."""
    fake = _fake(latency_ms=250, token_latency_ms=20)
    response = fake.handle("POST", CHAT, json.dumps(_request(stream=True, max_tokens=5)).encode())
    assert response.delay_s == pytest.approx(0.25)
    started = time.perf_counter()
    raw = asyncio.run(response.read())
    assert time.perf_counter() - started >= 0.02 * len(parse_sse(raw)) * 0.9


def test_malformed_json_and_sse() -> None:
    """malformed_json cuts a JSON document in half; malformed_sse breaks one event's framing."""
    body = _fake(malformed_json=True).handle("POST", CHAT, json.dumps(_request()).encode()).body
    with pytest.raises(ValueError):
        json.loads(body)
    raw = call_raw(_fake(malformed_json=True), _request(stream=True))
    second = raw.split(b"\n\n")[1]
    with pytest.raises(ValueError):
        json.loads(second.removeprefix(b"data: "))
    raw = call_raw(_fake(malformed_sse=True), _request(stream=True))
    assert b"\ndata {" in raw and raw.endswith(b"data: [DONE]\n\n")


def call_raw(fake: FakeVLLM, body: dict[str, Any]) -> bytes:
    return asyncio.run(fake.handle("POST", CHAT, json.dumps(body).encode()).read())


def test_fault_header_applies_to_one_request() -> None:
    """x-fake-fault sets switches for that request only; unknown names are a 400."""
    fake = FakeVLLM()
    hit = call(fake, CHAT, _request(), headers={"X-Fake-Fault": "no_token_ids, length_mismatch=0"})
    assert "token_ids" not in hit.body["choices"][0]
    assert "token_ids" in call(fake, CHAT, _request()).body["choices"][0]
    bad = call(fake, CHAT, _request(), headers={"x-fake-fault": "meteor_strike"})
    assert bad.status == 400 and "meteor_strike" in bad.body["error"]["message"]


def test_faults_change_at_runtime() -> None:
    """Switches are plain attributes: the next request sees a change."""
    fake = FakeVLLM()
    fake.faults.no_token_ids = True
    assert "token_ids" not in call(fake, CHAT, _request()).body["choices"][0]
    fake.faults.no_token_ids = False
    assert "token_ids" in call(fake, CHAT, _request()).body["choices"][0]
