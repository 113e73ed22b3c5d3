"""The fake against real vLLM 0.32 captures: same request, same wire structure.

Each capture's request is replayed on a fake configured like the capture server (model `tiny`,
`max_model_len` 1024, hermes tool parser). A scripted responder makes the fake "say" what the real
model said (the capture's text, padded when the real output hit `max_tokens`), so both outputs
end the same way. Ids and texts differ (different tokenizer); key order, null-vs-present patterns,
scalar types and the SSE event structure must not.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tests.support.capture_replay import CAPTURES, Capture, capture_names, load_capture
from tests.support.fake_vllm_calls import (
    DONE,
    call,
    compatible,
    parse_sse,
    skeleton,
    stream_token_ids,
)
from tito_agents.testing import FakeConfig, FakeVLLM, Faults, RequestView, hermes_tool_call

NOT_SERVED = {
    "generate": "/inference/v1/generate needs --enable-scale-out; the fake does not serve it",
    "generate_stream": "/inference/v1/generate is not served by the fake",
    "generate_text": "/inference/v1/generate is not served by the fake",
    "render_chat": "render endpoints need --enable-scale-out; the fake does not serve them",
    "responses": "the Responses API has no return_token_ids; the fake does not serve it",
    "responses_plain": "the Responses API is not served by the fake",
    "responses_stream": "the Responses API is not served by the fake",
}
SERVED = [name for name in capture_names() if name not in NOT_SERVED]


def test_every_capture_is_replayed_or_excused() -> None:
    """Every capture file is either replayed below or listed with the reason it is not."""
    assert CAPTURES.is_dir(), CAPTURES
    assert len(SERVED) >= 30
    assert set(NOT_SERVED) <= set(capture_names())


@pytest.mark.parametrize("name", SERVED)
def test_capture_structure(name: str, tokenizer: Any) -> None:
    """Replaying the capture's request gives the capture's status and wire structure."""
    capture = load_capture(name)
    request = dict(capture.request)
    texts = _said_texts(capture)
    if request.get("stop_token_ids"):
        # The capture's stop id belongs to another vocabulary: stop at our second token instead.
        request["stop_token_ids"] = [tokenizer.encode(texts[0], add_special_tokens=False)[1]]
    faults = Faults(include_reasoning_nulls=request.get("include_reasoning") is False)
    fake = FakeVLLM(
        FakeConfig(model="tiny", max_model_len=1024, responder=_scripted(texts), faults=faults)
    )
    result = call(fake, capture.path, request, method=capture.method)

    assert result.status == capture.status, result.raw[:300]
    if capture.is_stream:
        assert result.events is not None
        _assert_same_stream_structure(result.events, parse_sse(capture.body))
        _assert_stream_invariants(result.events)
    else:
        assert compatible(skeleton(result.body), skeleton(capture.json())) == []
        _assert_body_invariants(result.body)


# -- what the real model said --------------------------------------------------------------------


def _scripted(texts: Sequence[str]) -> Callable[[RequestView], str]:
    """A responder returning the given texts in sampling order (output index order)."""
    counter = itertools.count()
    return lambda view: texts[next(counter) % len(texts)]


def _said_texts(capture: Capture) -> list[str]:
    """Per output index, text that makes the fake end like the capture did."""
    request = capture.request
    if capture.status != 200 or "choices" not in (
        parse_sse(capture.body)[0] if capture.is_stream else capture.json()
    ):
        return ["A short answer."]
    outputs = _stream_outputs(capture) if capture.is_stream else _body_outputs(capture)
    prefill = ""
    if request.get("echo") and capture.path.endswith("chat/completions"):
        prefill = request["messages"][-1]["content"]
    texts = []
    for text, finish, stop_reason in outputs:
        text = text[len(prefill) :] if prefill and text.startswith(prefill) else text
        if isinstance(stop_reason, str):
            include = request.get("include_stop_str_in_output")
            text = (text if include else text + stop_reason) + " and more"
        elif isinstance(stop_reason, int):
            text = "function esul and more"
        elif finish == "length":
            text = (text or "x") + ("9" if text.rstrip().endswith("9") else " more") * 200
        texts.append(text)
    return texts


def _body_outputs(capture: Capture) -> list[tuple[str, str, Any]]:
    outputs = []
    for choice in capture.json()["choices"]:
        if "message" in choice:
            message = choice["message"]
            text = message["content"] or ""
            for call_ in message.get("tool_calls") or []:
                function = call_["function"]
                text += hermes_tool_call(function["name"], json.loads(function["arguments"]))
        else:
            text = choice["text"]
        outputs.append((text, choice["finish_reason"], choice["stop_reason"]))
    return outputs


def _stream_outputs(capture: Capture) -> list[tuple[str, str, Any]]:
    texts: dict[int, str] = {}
    calls: dict[int, dict[str, str]] = {}
    endings: dict[int, tuple[str, Any]] = {}
    for event in parse_sse(capture.body):
        if event == DONE:
            continue
        for choice in event["choices"]:
            index = choice["index"]
            part = choice.get("delta", {}).get("content") if "delta" in choice else choice["text"]
            texts[index] = texts.get(index, "") + (part or "")
            for delta in choice.get("delta", {}).get("tool_calls") or []:
                call_ = calls.setdefault(index, {"name": "", "arguments": ""})
                call_["name"] += delta["function"].get("name", "")
                call_["arguments"] += delta["function"].get("arguments", "")
            if choice["finish_reason"] is not None:
                endings[index] = (choice["finish_reason"], choice.get("stop_reason"))
    outputs = []
    for index in sorted(texts):
        text = texts[index]
        if index in calls:
            text += hermes_tool_call(calls[index]["name"], json.loads(calls[index]["arguments"]))
        outputs.append((text, *endings[index]))
    return outputs


# -- stream structure ----------------------------------------------------------------------------


def _category(event: dict[str, Any], seen: set[int]) -> str:
    if not event["choices"]:
        return "usage"
    choice = event["choices"][0]
    if "role" in choice.get("delta", {}):
        return "role"
    first = choice["index"] not in seen and "text" in choice
    seen.add(choice["index"])
    finish = choice["finish_reason"] is not None
    return f"{'first-' if first else ''}{'finish' if finish else 'middle'}"


def _stream_shapes(events: list[Any]) -> tuple[dict[str, list[Any]], set[Any], list[int]]:
    """Shapes per chunk category (deltas taken out), the delta shapes, role chunk indices."""
    shapes: dict[str, list[Any]] = {}
    deltas: set[Any] = set()
    roles: list[int] = []
    seen: set[int] = set()
    for event in events:
        if event == DONE:
            continue
        category = _category(event, seen)
        if category == "role":
            roles.append(event["choices"][0]["index"])
        elif event["choices"] and "delta" in event["choices"][0]:
            event = {**event, "choices": [dict(event["choices"][0])]}
            delta = event["choices"][0].pop("delta")
            if delta:
                deltas.add(skeleton(delta))
        shape = skeleton(event)
        if shape not in shapes.setdefault(category, []):
            shapes[category].append(shape)
    return shapes, deltas, roles


def _assert_same_stream_structure(ours: list[Any], theirs: list[Any]) -> None:
    assert (ours[-1] == DONE) == (theirs[-1] == DONE)
    our_shapes, our_deltas, our_roles = _stream_shapes(ours)
    their_shapes, their_deltas, their_roles = _stream_shapes(theirs)
    assert sorted(our_roles) == sorted(their_roles)
    assert sorted(our_shapes) == sorted(their_shapes)
    for category, shapes in their_shapes.items():
        for shape in our_shapes[category]:
            problems = [compatible(shape, theirs_) for theirs_ in shapes]
            assert [] in problems, (category, problems)
    assert our_deltas == their_deltas


# -- invariants ----------------------------------------------------------------------------------


def _assert_body_invariants(body: Any) -> None:
    if not isinstance(body, dict) or "usage" not in body:
        return
    choices = body["choices"]
    ids = [c["token_ids"] for c in choices]
    if all(isinstance(i, list) for i in ids):
        assert body["usage"]["completion_tokens"] == sum(len(i) for i in ids)
    if isinstance(body.get("prompt_token_ids"), list):
        assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    assert (
        body["usage"]["total_tokens"]
        == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )


def _assert_stream_invariants(events: list[Any]) -> None:
    chunks = [e for e in events if e != DONE]
    assert all(len(c["choices"]) <= 1 for c in chunks)
    usage = [c["usage"] for c in chunks if not c["choices"]]
    streamed = stream_token_ids(chunks)
    if usage and any(streamed.values()):
        assert usage[0]["completion_tokens"] == sum(len(v) for v in streamed.values())
