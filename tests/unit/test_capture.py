"""Capture against real vLLM 0.32 server output (replayed in process), sync and async clients.

What a captured call holds for every wire shape the server sends (ids per choice, logprobs), what
the request gains and the caller sees, retries and redelivery. Attribution (episodes, agents,
labels, resolvers) is tested in test_episodes, the collector's wiring in test_collector.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import tito_agents as tito
from tests.support.capture_replay import (
    Capture,
    Replay,
    load_capture,
    replay_clients,
    run_async,
    run_sync,
    split_request,
)
from tito_agents.testing import captured_samples

ID_CAPTURES = [
    "chat_ns",
    "chat_ns_n2",
    "chat_ns_tokid",
    "chat_prefill",
    "chat_tokens_in",
    "chat_stream",
    "chat_stream_n2",
    "chat_stream_lp",
    "eos",
    "eos_noskip",
    "eos_stream",
    "eos_cmpl",
    "stop_tok",
    "stop_str",
    "stop_str_mid",
    "stop_str_incl",
    "stop_str_stream",
    "tool_auto",
    "tool_auto_stream",
    "tool_required",
    "tool_named",
    "multi_turn_tool",
    "cmpl_ns",
    "cmpl_ns_echo",
    "cmpl_multi",
    "cmpl_tokens_in",
    "cmpl_stream",
    "cmpl_stream_n2",
    # SmolLM2-135M on a real vLLM 0.32 (tests/data/real_vllm): real ids, forced tool calls
    "real/chat_ns",
    "real/chat_ns_n2",
    "real/chat_stream",
    "real/chat_stream_n2",
    "real/chat_tokens_in",
    "real/cmpl_rescore",
    "real/multi_turn_tool",
    "real/tool_auto",
    "real/tool_auto_stream",
    "real/tool_auto_text",
    "real/tool_named",
    "real/tool_required",
    "real/tool_required_stream",
    "real/tool_required_strict",
]


def expected_ids(cap: Capture) -> dict[int, tuple[list[int], list[int]]]:
    """Independently derive (prompt ids, sampled ids) per choice index from a capture."""
    out: dict[int, tuple[list[int], list[int]]] = {}
    chat = "messages" in cap.request
    if not cap.is_stream:
        body = cap.json()
        for choice in body["choices"]:
            prompt = body["prompt_token_ids"] if chat else choice["prompt_token_ids"]
            out[choice["index"]] = (prompt, choice["token_ids"])
        return out
    prompts: dict[int, list[int]] = {}
    sampled: dict[int, list[int]] = {}
    for event in cap.events():
        data = event.strip()[len(b"data: ") :]
        if data == b"[DONE]":
            continue
        chunk = json.loads(data)
        for choice in chunk["choices"]:
            i = choice["index"]
            holder = chunk if chat else choice
            if holder.get("prompt_token_ids") is not None and i not in prompts:
                prompts[i] = holder["prompt_token_ids"]
            sampled.setdefault(i, []).extend(choice.get("token_ids") or [])
    return {i: (prompts[i], sampled[i]) for i in prompts}


@pytest.mark.parametrize("name", ID_CAPTURES)
def test_sync_capture_matches_server_ids(name: str) -> None:
    """Every captured call of a sync client holds exactly the ids the server returned, per choice."""
    cap = load_capture(name)
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode("ep") as ep:
        run_sync(client, cap)
    want = expected_ids(cap)
    assert {c.choice_index for c in ep.calls} == set(want)
    for call in ep.calls:
        assert call.status is tito.CallStatus.COMPLETE, call.error
        prompt, sampled = want[call.choice_index]
        assert call.prompt_ids.tolist() == prompt
        assert call.sampled_ids.tolist() == sampled
        assert call.stream is cap.is_stream
    assert len(captured_samples(collector)) == len(want)


@pytest.mark.parametrize("name", ID_CAPTURES)
async def test_async_capture_matches_server_ids(name: str) -> None:
    """The async client captures the same ids as the sync one, for every wire shape."""
    cap = load_capture(name)
    replay = Replay([cap])
    _, client = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    async with collector.episode("ep") as ep:
        await run_async(client, cap)
    want = expected_ids(cap)
    assert sorted(c.choice_index for c in ep.calls) == sorted(want)
    for call in ep.calls:
        prompt, sampled = want[call.choice_index]
        assert call.status is tito.CallStatus.COMPLETE, call.error
        assert call.prompt_ids.tolist() == prompt
        assert call.sampled_ids.tolist() == sampled


def test_caller_gets_identical_body() -> None:
    """The wrapped client hands the caller the server's bytes unchanged."""
    cap = load_capture("tool_auto")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    tito.Collector(capture_logprobs=False).wrap(client)
    base, _ = split_request(cap.request)
    raw = client.chat.completions.with_raw_response.create(**base)
    assert raw.http_response.content == cap.body
    parsed = raw.parse()
    assert parsed.choices[0].message.tool_calls[0].function.name == "get_weather"


async def test_caller_gets_identical_stream() -> None:
    """Streamed chunks reach the caller unchanged and in order."""
    cap = load_capture("tool_auto_stream")
    plain_replay, cap_replay = Replay([cap]), Replay([cap])
    _, plain = replay_clients(plain_replay)
    _, wrapped = replay_clients(cap_replay)
    tito.Collector(capture_logprobs=False).wrap(wrapped)
    plain_chunks = [c.model_dump() for c in await run_async(plain, cap)]
    wrapped_chunks = [c.model_dump() for c in await run_async(wrapped, cap)]
    assert wrapped_chunks == plain_chunks


def test_logprobs_are_captured_and_aligned() -> None:
    """Chat logprobs land on the sampled tokens, one per id (EOS included)."""
    cap = load_capture("eos")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode() as ep:
        run_sync(client, cap)
    call = ep.calls[0]
    body = cap.json()
    want = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert call.logprobs is not None
    assert call.logprobs.tolist() == pytest.approx(want, rel=1e-6)
    sample = captured_samples(collector)[0]
    n_prompt = len(body["prompt_token_ids"])
    assert sample.logprobs[:n_prompt].tolist() == [0.0] * n_prompt
    assert sample.logprobs[n_prompt:].tolist() == pytest.approx(want, rel=1e-6)


async def test_streamed_logprobs_are_captured() -> None:
    """Per-chunk logprobs in a stream concatenate in the order of the ids."""
    cap = load_capture("chat_stream_lp")
    _, client = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    async with collector.episode() as ep:
        await run_async(client, cap)
    call = ep.calls[0]
    assert call.status is tito.CallStatus.COMPLETE
    assert call.logprobs is not None and call.logprobs.shape == call.sampled_ids.shape


def test_request_gets_vllm_fields_without_overriding_the_caller() -> None:
    """return_token_ids and logprobs are added only when the caller did not set them."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    tito.Collector(capture_logprobs=True).wrap(client)
    with tito.Collector().episode():
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], logprobs=False
        )
    assert replay.received[0]["return_token_ids"] is True
    assert replay.received[0]["logprobs"] is True
    assert replay.received[1]["logprobs"] is False


def test_caller_opt_out_is_respected() -> None:
    """A caller that sets return_token_ids=false is not captured (and not overridden)."""
    cap = load_capture("chat_ns_plain")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"return_token_ids": False},
        )
    assert replay.received[0]["return_token_ids"] is False
    assert ep.calls == []
    assert collector.stats.skipped_requests == 1


def test_other_hosts_are_untouched() -> None:
    """Requests to hosts not marked as vLLM are sent unchanged and never captured."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client, vllm_hosts=["other-host:8000"])
    with collector.episode() as ep:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert "return_token_ids" not in replay.received[0]
    assert "logprobs" not in replay.received[0]
    assert ep.calls == []


def test_retried_request_yields_one_call() -> None:
    """A 503 then a 200: the SDK retries, the failed attempt is not a call, one sample results."""
    cap = load_capture("chat_ns")
    replay = Replay([503, 429, cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode() as ep:
        client.with_options(max_retries=3).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}]
        )
    assert len(replay.received) == 3
    assert len(ep.calls) == 1
    assert collector.stats.failed_attempts == 2
    assert len(captured_samples(collector)) == 1


def test_redelivered_response_is_deduplicated() -> None:
    """The same response id seen twice in one episode yields one call, counted as a duplicate."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode() as ep:
        for _ in range(2):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}]
            )
    assert len(ep.calls) == 1
    assert collector.stats.duplicate_calls == 1


def test_no_credentials_are_persisted(tmp_path: Any) -> None:
    """Neither the API key nor the Authorization header reaches a call record or the samples file."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    out = tmp_path / "s.jsonl"
    collector = tito.Collector(out)
    collector.wrap(client)
    with collector.episode() as ep:
        run_sync(client, cap)
    collector.close()
    assert replay.headers[0]["authorization"] == "Bearer sk-secret-test-key"
    assert b"sk-secret" not in out.read_bytes()
    assert "sk-secret" not in repr(vars(ep)) + repr([c.__repr__() for c in ep.calls])
    for call in ep.calls:
        assert "sk-secret" not in json.dumps(
            {k: str(getattr(call, k)) for k in call.__slots__}  # type: ignore[attr-defined]
        )
