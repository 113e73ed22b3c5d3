"""Capture of the Responses API (`POST /v1/responses`) against real vLLM 0.32 output (SmolLM2,
tests/data/real_vllm/responses_*.txt, replayed in process), sync and async openai clients.

One response is one call: the prompt ids from `input_messages[0].tokens`, the sampled ids from
`output_messages[0].tokens` (the non-stream body, or a stream's `response.completed` event), the
logprobs of the output text, function calls and reasoning as structured fields; the caller sees
the body it would get without capture."""

from __future__ import annotations

import json
from typing import Any

import pytest

import tito_agents as tito
from tests.support.capture_replay import Capture, Replay, load_capture, replay_clients
from tito_agents.calls import Endpoint
from tito_agents.testing import captured_samples

RESPONSES_CAPTURES = [
    "real/responses_ns",
    "real/responses_incomplete",
    "real/responses_stream",
    "real/responses_stream_eos",
    "real/responses_tool_required",
    "real/responses_tool_required_stream",
    "real/responses_tool_auto",
    "real/responses_multi_turn_tool",
    "real/responses_store_false",
]
_NATIVE = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "include",
    "top_logprobs",
    "store",
    "previous_response_id",
}


def final_response(cap: Capture) -> dict[str, Any]:
    """The response object of a capture: the body, or a stream's `response.completed` event."""
    if not cap.is_stream:
        return cap.json()  # type: ignore[no-any-return]
    for event in cap.events():
        for line in event.splitlines():
            if line.startswith(b"data: "):
                data = json.loads(line[len(b"data: ") :])
                if data["type"] == "response.completed":
                    return data["response"]  # type: ignore[no-any-return]
    raise AssertionError("no response.completed event")


def sdk_args(request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """openai SDK arguments for a capture's request (vLLM-only fields in extra_body); capture
    adds the id and logprob fields itself."""
    req = dict(request)
    stream = bool(req.pop("stream", False))
    for key in ("enable_response_messages", "include", "top_logprobs"):
        req.pop(key, None)
    args = {k: req.pop(k) for k in list(req) if k in _NATIVE}
    args["extra_body"] = req
    return args, stream


def run_sync(client: Any, cap: Capture) -> Any:
    args, stream = sdk_args(cap.request)
    if not stream:
        return client.responses.create(**args)
    with client.responses.stream(**args) as events:
        for _ in events:
            pass
        return events.get_final_response()


async def run_async(client: Any, cap: Capture) -> Any:
    args, stream = sdk_args(cap.request)
    if not stream:
        return await client.responses.create(**args)
    async with client.responses.stream(**args) as events:
        async for _ in events:
            pass
        return await events.get_final_response()


def check_call(call: tito.Call, cap: Capture, *, logprobs: bool) -> None:
    body = final_response(cap)
    assert call.status is tito.CallStatus.COMPLETE, call.error
    assert call.endpoint is Endpoint.RESPONSES
    assert call.call_id == f"{body['id']}/0"
    assert call.prompt_ids.tolist() == body["input_messages"][0]["tokens"]
    assert call.sampled_ids.tolist() == body["output_messages"][0]["tokens"]
    assert call.stream is cap.is_stream
    calls = [i for i in body["output"] if i["type"] == "function_call"]
    assert call.tool_calls == (
        [{k: i[k] for k in ("call_id", "name", "arguments", "id")} for i in calls] or None
    )
    status = body["status"]
    want_finish = "length" if status == "incomplete" else ("tool_calls" if calls else "stop")
    assert call.finish_reason == want_finish
    entries = [
        e["logprob"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
        for e in part.get("logprobs") or ()
    ]
    if logprobs and len(entries) == call.num_sampled:
        assert call.logprobs is not None
        assert call.logprobs.tolist() == pytest.approx(entries, rel=1e-6)
    else:  # vLLM 0.32 gives no logprobs for tokens turned into function calls, and a stream's
        # entries are per text delta (none for the EOS): ids exact, no logprobs
        assert call.logprobs is None
        assert bool(calls) or cap.is_stream


@pytest.mark.parametrize("name", RESPONSES_CAPTURES)
def test_sync_responses_capture_matches_server_ids(name: str) -> None:
    """Every Responses call of a sync client holds exactly the server's ids and its items."""
    cap = load_capture(name)
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode("ep") as ep:
        run_sync(client, cap)
    assert len(ep.calls) == 1
    check_call(ep.calls[0], cap, logprobs=True)
    sent = replay.received[0]
    assert sent["enable_response_messages"] is True
    assert sent["include"] == ["message.output_text.logprobs"] and sent["top_logprobs"] == 0
    assert len(captured_samples(collector)) == 1


@pytest.mark.parametrize("name", RESPONSES_CAPTURES)
async def test_async_responses_capture_matches_server_ids(name: str) -> None:
    """The async client captures the same ids, non-stream and stream."""
    cap = load_capture(name)
    _, client = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    async with collector.episode("ep") as ep:
        await run_async(client, cap)
    assert len(ep.calls) == 1
    check_call(ep.calls[0], cap, logprobs=True)


def _view(response: Any) -> dict[str, Any]:
    """A parsed Response without what differs between two server responses (ids, times)."""
    data = response.model_dump()
    for key in ("id", "created_at"):
        data.pop(key)
    for item in data["output"]:
        item.pop("id", None)
    return data  # type: ignore[no-any-return]


def test_caller_sees_the_response_it_would_get_without_capture() -> None:
    """Capture adds ids and logprobs to the request; the caller's response is the one vLLM sends
    a request without them (`responses_ns_plain`): the added fields are null again."""
    cap, plain = load_capture("real/responses_ns"), load_capture("real/responses_ns_plain")
    client, _ = replay_clients(Replay([cap]))
    unwrapped, _ = replay_clients(Replay([plain]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode() as ep:
        got = run_sync(client, cap)
    assert ep.calls[0].status is tito.CallStatus.COMPLETE
    want = run_sync(unwrapped, plain)
    assert _view(got) == _view(want)
    assert got.model_extra["input_messages"] is None
    assert got.output[0].content[0].logprobs is None


def test_caller_asking_for_ids_and_logprobs_keeps_them() -> None:
    """A caller that sets enable_response_messages and the logprob include gets them unchanged."""
    cap = load_capture("real/responses_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    tito.Collector(capture_logprobs=True).wrap(client)
    with tito.Collector().episode():
        raw = client.responses.with_raw_response.create(
            model="m",
            input="x",
            include=["message.output_text.logprobs"],
            top_logprobs=0,
            extra_body={"enable_response_messages": True},
        )
    assert raw.http_response.content == cap.body
    assert replay.received[0]["include"] == ["message.output_text.logprobs"]


def test_caller_include_is_extended_not_replaced() -> None:
    """Capture appends its include entry to the caller's own and keeps the caller's top_logprobs."""
    replay = Replay([load_capture("real/responses_ns")])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode():
        got = client.responses.create(
            model="m", input="x", include=["reasoning.encrypted_content"], top_logprobs=0
        )
    sent = replay.received[0]
    assert sent["include"] == ["reasoning.encrypted_content", "message.output_text.logprobs"]
    assert sent["top_logprobs"] == 0
    assert got.top_logprobs == 0  # what the server echoed; capture nulls only what it added


def test_no_include_is_added_next_to_a_callers_positive_top_logprobs() -> None:
    """vLLM checks `top_logprobs` against its `--max-logprobs` only when the output logprobs are
    included: capture adding the entry next to the caller's 2 could make a server started with
    a lower limit refuse a request it accepts. The call keeps its exact ids, without logprobs."""
    replay = Replay([load_capture("real/responses_ns")])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode():
        client.responses.create(
            model="m", input="x", include=["reasoning.encrypted_content"], top_logprobs=2
        )
    sent = replay.received[0]
    assert sent["include"] == ["reasoning.encrypted_content"]
    assert sent["top_logprobs"] == 2 and sent["enable_response_messages"] is True


def test_responses_opt_out_is_respected() -> None:
    """enable_response_messages=false from the caller: not captured, not overridden."""
    replay = Replay([load_capture("real/responses_ns_plain")])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        client.responses.create(
            model="m", input="x", extra_body={"enable_response_messages": False}
        )
    assert replay.received[0]["enable_response_messages"] is False
    assert "include" not in replay.received[0]
    assert ep.calls == []
    assert collector.stats.skipped_requests == 1


def test_other_hosts_get_no_vllm_fields() -> None:
    """A Responses request to a host not marked as vLLM is sent unchanged and never captured."""
    replay = Replay([load_capture("real/responses_ns_plain")])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client, vllm_hosts=["other-host:8000"])
    with collector.episode() as ep:
        client.responses.create(model="m", input="x")
    assert replay.received[0] == {"model": "m", "input": "x"}
    assert ep.calls == []


def test_server_without_response_messages_is_a_typed_error() -> None:
    """A server that ignores enable_response_messages (older vLLM, another server): the call is
    unusable with MissingTokenIdsError and its fix; under the raise policy the caller gets it."""
    cap = load_capture("real/responses_ns_plain")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False, errors="count")
    collector.wrap(client)
    with collector.episode() as ep:
        got = client.responses.create(model="m", input="x")
    assert got.output_text == cap.json()["output"][0]["content"][0]["text"]
    call = ep.calls[0]
    assert call.status is tito.CallStatus.UNUSABLE
    assert isinstance(call.error, tito.MissingTokenIdsError)
    assert "vLLM >= 0.32" in (call.error.fix or "")
    strict = tito.Collector(capture_logprobs=False, errors="raise")
    client2, _ = replay_clients(Replay([cap]))
    strict.wrap(client2)
    with pytest.raises(tito.MissingTokenIdsError), strict.episode():
        client2.responses.create(model="m", input="x")


@pytest.mark.parametrize(
    "name",
    ["real/responses_previous_id", "real/responses_err_validation", "real/responses_err_model"],
)
def test_error_responses_reach_the_caller_and_are_no_call(name: str) -> None:
    """vLLM's 4xx errors (an unknown previous_response_id: vLLM 0.32 stores no responses unless
    VLLM_ENABLE_RESPONSES_API_STORE is set; a bad parameter; an unknown model) reach the caller as
    the SDK's typed errors; a failed attempt is not a call."""
    import openai

    cap = load_capture(name)
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector()
    collector.wrap(client)
    args, _ = sdk_args(cap.request)
    with collector.episode() as ep, pytest.raises(openai.APIStatusError) as info:
        client.responses.create(**args)
    assert info.value.status_code == cap.status
    assert ep.calls == []
    assert collector.stats.failed_attempts == 1


def test_retried_responses_request_yields_one_call() -> None:
    """A 503 and a 429, then the response: one call, the failed attempts counted."""
    cap = load_capture("real/responses_stream")
    replay = Replay([503, 429, cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        run_sync(client.with_options(max_retries=3), cap)
    assert len(replay.received) == 3
    assert [c.status for c in ep.calls] == [tito.CallStatus.COMPLETE]
    assert collector.stats.failed_attempts == 2


def test_a_session_episode_starts_a_session_with_a_responses_call() -> None:
    """The first Responses call of a session episode is sent as it came (no token prompt: the
    session has no turn yet) and noted `first`; its ids stay exact. Later turns:
    tests/integration/test_sessions_responses_fake.py."""
    cap = load_capture("real/responses_multi_turn_tool")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client, sessions=True)
    with collector.episode() as ep:
        run_sync(client, cap)
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE
    assert call.session == "first" and call.session_reason is None
    assert "kv_transfer_params" not in replay.received[0]
    check_call(call, cap, logprobs=True)


def test_previous_response_id_on_a_storing_server_is_exact_and_merges() -> None:
    """On a vLLM started with VLLM_ENABLE_RESPONSES_API_STORE=1, `previous_response_id` works:
    the server prepends the stored turn, and `input_messages` hold the prompt it rendered (the
    first turn's prompt and sampled ids, then the new user turn). Both calls are exact, and merged
    assembly makes one sample that trains each sampled token once."""
    first, followup = (
        load_capture("real/responses_store_first"),
        load_capture("real/responses_store_followup"),
    )
    client, _ = replay_clients(Replay([first, followup]))
    collector = tito.Collector(capture_logprobs=False, assembly="merged")
    collector.wrap(client)
    with collector.episode() as ep:
        one = client.responses.create(model="m", input="Say hello.", store=True)
        client.responses.create(model="m", input="And again.", previous_response_id=one.id)
    a, b = ep.calls
    for call, cap in ((a, first), (b, followup)):
        assert call.status is tito.CallStatus.COMPLETE
        assert call.prompt_ids.tolist() == cap.json()["input_messages"][0]["tokens"]
        assert call.sampled_ids.tolist() == cap.json()["output_messages"][0]["tokens"]
    history = a.prompt_ids.tolist() + a.sampled_ids.tolist()
    assert b.prompt_ids.tolist()[: len(history)] == history
    (sample,) = captured_samples(collector)
    assert int(sample.loss_mask.sum()) == a.num_sampled + b.num_sampled


def _with_items(cap: Capture, *items: dict[str, Any], ids: list[int]) -> Capture:
    """The capture with `items` before its output, sampled as `ids` before its output ids."""
    body = cap.json()
    body["output"] = [*items, *body["output"]]
    body["output_messages"][0]["tokens"][:0] = ids
    body["usage"]["output_tokens"] += len(ids)
    return Capture(
        cap.name + "-items", cap.path, cap.request, cap.status, json.dumps(body).encode()
    )


def test_reasoning_items_are_structured_and_leave_exact_ids() -> None:
    """A reasoning-parser server puts reasoning in `reasoning` items (content or summary parts):
    their texts are `Call.reasoning`; vLLM gives those tokens no logprobs, so the call keeps its
    exact ids and has none (never logprobs shifted onto the wrong tokens)."""
    cap = _with_items(
        load_capture("real/responses_ns"),
        {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "The user wants one word."}],
        },
        ids=[504, 2638, 3107, 614, 1345, 1932, 30],
    )
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode() as ep:
        client.responses.create(model="m", input="x")
    (call,) = ep.calls
    assert call.status is tito.CallStatus.COMPLETE
    assert call.reasoning == ["The user wants one word."]
    assert call.logprobs is None and call.tool_calls is None
    assert call.sampled_ids.tolist() == cap.json()["output_messages"][0]["tokens"]
