"""The fake's `/v1/responses` against the real vLLM 0.32 Responses captures (SmolLM2, CPU).

Prompt ids are compared token for token in test_fake_real_vllm; here: the wire shape (key order,
nulls, value types) of bodies and of every stream event type, the ids agreeing with the chat
endpoint for the same request, and each fault switch that applies to the Responses API."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.capture_replay import REAL_VLLM, Capture, load_capture
from tests.support.fake_vllm_calls import call, compatible, parse_sse, skeleton
from tito_agents.testing import FakeConfig, FakeVLLM, Faults, StreamCut

RESPONSES = "/v1/responses"
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def real_like(tokenizer: Any) -> FakeVLLM:
    return FakeVLLM(FakeConfig(max_model_len=4096, tokenizer=tokenizer))


def _capture(name: str) -> Capture:
    return load_capture(name, REAL_VLLM)


def _final(events: list[Any]) -> dict[str, Any]:
    done = [e for e in events if e["type"] == "response.completed"]
    assert len(done) == 1 and events[-1] is done[0]
    return done[0]["response"]  # type: ignore[no-any-return]


def _shape_problems(ours: Any, theirs: Any) -> list[str]:
    return compatible(skeleton(ours), skeleton(theirs))


@pytest.mark.parametrize(
    "name",
    [
        "responses_ns",
        "responses_incomplete",
        "responses_tool_required",
        "responses_tool_auto",
        "responses_multi_turn_tool",
        "responses_store_false",
        "responses_ns_plain",
    ],
)
def test_body_has_the_real_shape(real_like: FakeVLLM, name: str) -> None:
    """Same keys in the same order, the same nulls and types, as the real body (items by type:
    the fake's model may answer with text where the real one called a tool)."""
    capture = _capture(name)
    ours = call(real_like, RESPONSES, capture.request).body
    theirs = capture.json()
    items = {i["type"]: i for i in theirs["output"]}
    assert _shape_problems({**ours, "output": []}, {**theirs, "output": []}) == []
    for item in ours["output"]:
        if item["type"] in items:
            assert _shape_problems(item, items[item["type"]]) == [], item["type"]
    if capture.request.get("enable_response_messages"):
        assert ours["output_messages"][0]["tokens"][-1:] != [] and ours["usage"][
            "output_tokens"
        ] == len(ours["output_messages"][0]["tokens"])


@pytest.mark.parametrize(
    "name", ["responses_stream", "responses_stream_eos", "responses_tool_required_stream"]
)
def test_stream_events_have_the_real_shape(real_like: FakeVLLM, name: str) -> None:
    """Every event type the real stream sent has the real shape in the fake's stream; ids and
    sequence numbers count up from 0; only `response.completed` carries the token ids."""
    capture = _capture(name)
    ours = call(real_like, RESPONSES, capture.request).events
    assert ours is not None
    theirs = parse_sse(capture.body)
    real_by_type: dict[str, Any] = {}
    for event in theirs:
        real_by_type.setdefault(event["type"], event)
    assert [e["sequence_number"] for e in ours] == list(range(len(ours)))
    assert ours[0]["type"] == "response.created" and ours[1]["type"] == "response.in_progress"
    for event in ours:
        if event["type"] in real_by_type and event["type"] != "response.completed":
            real = real_by_type[event["type"]]
            assert _shape_problems(event, real) == [], event["type"]
        if "response" in event and event["type"] != "response.completed":
            assert event["response"]["input_messages"] is None
    final, real_final = _final(ours), _final(theirs)
    # the fake's model says other words: one may be cut by max_output_tokens, the other not
    cut = {"output": [], "incomplete_details": None, "status": ""}
    assert _shape_problems({**final, **cut}, {**real_final, **cut}) == []
    assert final["input_messages"][0]["tokens"] == real_final["input_messages"][0]["tokens"]


def test_stream_and_body_and_chat_agree_on_ids(real_like: FakeVLLM) -> None:
    """The stream's final event holds the body's ids, and the chat endpoint samples the same ids
    for the same conversation: the fake renders and samples Responses through the chat path."""
    request = {"input": "Say hello.", "max_output_tokens": 12, "enable_response_messages": True}
    body = call(real_like, RESPONSES, request).body
    final = _final(call(real_like, RESPONSES, {**request, "stream": True}).events or [])
    chat = call(
        real_like,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12,
            "return_token_ids": True,
        },
    ).body
    for key in ("input_messages", "output_messages"):
        assert final[key][0]["tokens"] == body[key][0]["tokens"]
    assert body["input_messages"][0]["tokens"] == chat["prompt_token_ids"]
    assert body["output_messages"][0]["tokens"] == chat["choices"][0]["token_ids"]


def test_logprobs_cover_the_text_tokens_and_none_for_calls(real_like: FakeVLLM) -> None:
    """With the logprob include, a text answer has one entry per sampled id (EOS included); a
    function call has none, as vLLM 0.32 sends."""
    include = {"include": ["message.output_text.logprobs"], "top_logprobs": 0}
    ids = {"enable_response_messages": True}
    text = call(real_like, RESPONSES, {"input": "Hi", **include, **ids}).body
    entries = text["output"][0]["content"][0]["logprobs"]
    assert len(entries) == len(text["output_messages"][0]["tokens"])
    tool = call(
        real_like,
        RESPONSES,
        {"input": "weather in Paris", "tools": [TOOL], "tool_choice": "required", **include, **ids},
    ).body
    assert [i["type"] for i in tool["output"]] == ["function_call"]
    assert tool["output"][0]["arguments"] == '{"city": "Paris"}'


def test_multi_turn_items_render_as_chat_messages(real_like: FakeVLLM) -> None:
    """A function_call joins the assistant message before it; its output is a tool message."""
    capture = _capture("responses_multi_turn_tool")
    body = call(real_like, RESPONSES, capture.request).body
    assert (
        "<tool_response>\n18 degrees, sunny\n</tool_response>"
        in body["input_messages"][0]["message"]
    )


def test_no_token_ids_fault_nulls_the_response_messages() -> None:
    """no_token_ids: a server that ignores enable_response_messages (vLLM < 0.32 for non-harmony
    models) sends input_messages/output_messages as null, in bodies and in the final event."""
    fake = FakeVLLM(FakeConfig(faults=Faults(no_token_ids=True)))
    request = {"input": "Hi", "enable_response_messages": True}
    body = call(fake, RESPONSES, request).body
    assert body["input_messages"] is None and body["output_messages"] is None
    final = _final(call(fake, RESPONSES, {**request, "stream": True}).events or [])
    assert final["input_messages"] is None and final["output_messages"] is None


def test_length_mismatch_fault_drops_the_last_sampled_id() -> None:
    fake = FakeVLLM(FakeConfig(faults=Faults(length_mismatch=True)))
    body = call(fake, RESPONSES, {"input": "Hi", "enable_response_messages": True}).body
    assert len(body["output_messages"][0]["tokens"]) == body["usage"]["output_tokens"] - 1


def test_transport_faults_apply_to_responses_streams() -> None:
    """cut_stream_after, malformed_sse and status_before_body work on Responses as on chat."""
    request = {"input": "Hi", "stream": True, "enable_response_messages": True}
    fake = FakeVLLM(FakeConfig(faults=Faults(cut_stream_after=3)))
    response = fake.handle("POST", RESPONSES, json.dumps(request).encode())
    with pytest.raises(StreamCut):
        asyncio.run(response.read())
    fake = FakeVLLM(FakeConfig(faults=Faults(malformed_sse=True)))
    raw = asyncio.run(fake.handle("POST", RESPONSES, json.dumps(request).encode()).read())
    assert b"event: response.in_progress\ndata {" in raw
    fake = FakeVLLM()
    fake.fail_next(1, status=503)
    assert call(fake, RESPONSES, request).status == 503
    assert call(fake, RESPONSES, request).status == 200


def test_previous_response_id_is_not_found_as_on_vllm_032(real_like: FakeVLLM) -> None:
    """vLLM 0.32 keeps no responses unless VLLM_ENABLE_RESPONSES_API_STORE=1 (off by default)."""
    capture = _capture("responses_previous_id")
    result = call(real_like, RESPONSES, capture.request)
    assert result.status == 404 and result.body == capture.json()


def test_stream_logprobs_are_per_text_delta_as_on_vllm_032(real_like: FakeVLLM) -> None:
    """A real stream that ends with EOS (`responses_stream_eos`: 7 ids, 6 entries) has one
    logprob entry per text delta: none for the EOS. The fake's does the same, while its body
    has one entry per id."""
    capture = _capture("responses_stream_eos")
    real = _final(parse_sse(capture.body))
    real_entries = real["output"][0]["content"][0]["logprobs"]
    assert len(real_entries) == len(real["output_messages"][0]["tokens"]) - 1
    request = {**capture.request, "max_output_tokens": 40}
    events = call(real_like, RESPONSES, request).events or []
    final = _final(events)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    entries = final["output"][0]["content"][0]["logprobs"]
    assert [e["token"] for e in entries] == [d["logprobs"][0]["token"] for d in deltas]
    ids = final["output_messages"][0]["tokens"]
    assert ids[-1] == 2 and len(entries) < len(ids)
    body = call(real_like, RESPONSES, {**request, "stream": False}).body
    assert len(body["output"][0]["content"][0]["logprobs"]) == len(ids)
