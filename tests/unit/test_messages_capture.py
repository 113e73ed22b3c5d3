"""The pieces of Messages capture that need no server: which requests are Messages calls, what
`prepare_request` makes of one, the probes of the server's conversion choices, and the relay of
a chat stream as Messages events whatever its chunking."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from tito_agents._capture.messages.relay import COUNT_TOKENS, TOKENIZE, MessagesRelay, probe_plan
from tito_agents._capture.messages.reply import MessagesStream, encode_event
from tito_agents._capture.wire import endpoint_for_path, prepare_request
from tito_agents._capture.wire.request import UnreadableRequest
from tito_agents.calls import Endpoint

REQUEST: dict[str, Any] = {
    "model": "m",
    "max_tokens": 16,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "Hi"}],
}


def test_only_the_messages_path_is_a_messages_call() -> None:
    assert endpoint_for_path("/v1/messages") is Endpoint.MESSAGES
    assert endpoint_for_path("/proxy/v1/messages/") is Endpoint.MESSAGES
    for path in ("/v1/messages/count_tokens", "/v1/messages/render", "/v1/messages/batches"):
        assert endpoint_for_path(path) is None


def test_a_messages_request_is_prepared_as_its_chat_conversion() -> None:
    prepared = prepare_request(
        Endpoint.MESSAGES, orjson.dumps({**REQUEST, "stream": True}), capture_logprobs=True
    )
    assert prepared is not None
    body, info = prepared
    assert body is not None
    chat = json.loads(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert chat["return_token_ids"] is True and chat["logprobs"] is True
    assert chat["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert info.endpoint is Endpoint.CHAT and info.translated_from == "messages" and info.stream
    assert info.sampling == {"max_tokens": 16, "max_completion_tokens": 16, "logprobs": True}


@pytest.mark.parametrize(
    ("request_", "options"),
    [
        ({**REQUEST, "max_tokens": 0}, {}),
        ({**REQUEST, "messages": [{"role": "tool", "content": "x"}]}, {}),
        ({**REQUEST, "messages": [*REQUEST["messages"], {"role": "system", "content": "x"}]}, {}),
        ({**REQUEST, "thinking": {"type": "disabled"}}, {"disabled_thinking_effort": None}),
    ],
    ids=["no max_tokens", "bad role", "merge unknown", "effort unknown"],
)
def test_what_the_conversion_leaves_to_the_server_is_unreadable(
    request_: dict[str, Any], options: dict[str, Any]
) -> None:
    with pytest.raises(UnreadableRequest):
        prepare_request(
            Endpoint.MESSAGES,
            orjson.dumps(request_),
            capture_logprobs=False,
            messages_options=options,
        )


def test_probed_choices_apply() -> None:
    inline = {**REQUEST, "messages": [*REQUEST["messages"], {"role": "system", "content": "X"}]}
    for merge, expected in ((True, "Be brief.X"), (False, "Be brief.")):
        prepared = prepare_request(
            Endpoint.MESSAGES,
            orjson.dumps(inline),
            capture_logprobs=False,
            messages_options={"merge_inline_system": merge},
        )
        assert prepared is not None and prepared[0] is not None
        assert json.loads(prepared[0])["messages"][0]["content"] == expected


def answer(data: Any, status: int = 200) -> tuple[int, bytes]:
    return status, orjson.dumps(data)


def test_the_merge_probe_decides_by_the_count_that_fits() -> None:
    plan = probe_plan("m", ["merge_inline_system"])
    asks = next(plan)
    assert [kind for kind, _ in asks] == [COUNT_TOKENS, TOKENIZE, TOKENIZE]
    with pytest.raises(StopIteration) as done:
        plan.send(
            [answer({"input_tokens": 5}), answer({"tokens": [1] * 5}), answer({"tokens": [1] * 7})]
        )
    assert done.value.value == {"merge_inline_system": True}
    plan = probe_plan("m", ["merge_inline_system"])
    next(plan)
    with pytest.raises(StopIteration) as done:
        plan.send([None, answer({"tokens": [1]}), answer({"tokens": [1, 2]})])
    assert done.value.value == {"merge_inline_system": None}


def test_the_effort_probe_decides_as_vllm_and_nothing_without_tokenize() -> None:
    plan = probe_plan("m", ["disabled_thinking_effort"])
    asks = next(plan)
    assert len(asks) == 6 and all(kind == TOKENIZE for kind, _ in asks)
    distinct = [answer({"tokens": [i]}) for i in range(6)]
    with pytest.raises(StopIteration) as done:
        plan.send(distinct)
    assert done.value.value == {"disabled_thinking_effort": "none"}
    plan = probe_plan("m", ["disabled_thinking_effort"])
    next(plan)
    with pytest.raises(StopIteration) as done:
        plan.send([answer({}, 404)] * 6)
    assert done.value.value == {"disabled_thinking_effort": None}


CHUNKS: list[dict[str, Any]] = [
    {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 0},
    },
    {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hé"}}]},
    {
        "id": "c1",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "llo"}, "finish_reason": "stop"}],
    },
    {
        "id": "c1",
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    },
]


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
def test_the_relay_sends_the_events_vllm_sends_whatever_the_chunking(size: int) -> None:
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in CHUNKS) + b"data: [DONE]\n\n"
    relay, out = MessagesRelay(), b""
    for start in range(0, len(raw), size):
        out += relay.feed(raw[start : start + size])
    out += relay.end()
    stream = MessagesStream()
    expected = [e for c in CHUNKS for e in stream.chunk(c)] + stream.done()
    assert out == b"".join(encode_event(name, data) for name, data in expected)
    names = [line[7:] for line in out.split(b"\n") if line.startswith(b"event: ")]
    assert names == [
        b"message_start",
        b"content_block_start",
        b"content_block_delta",
        b"content_block_delta",
        b"content_block_stop",
        b"message_delta",
        b"message_stop",
    ]


def test_a_chunk_that_is_not_json_ends_the_relay_with_an_error_event() -> None:
    relay = MessagesRelay()
    out = relay.feed(b"data: " + orjson.dumps(CHUNKS[0]) + b"\n\ndata: {broken\n\n")
    assert out.split(b"\n\n")[-2].startswith(b"event: error")
    assert relay.feed(b"data: " + orjson.dumps(CHUNKS[1]) + b"\n\n") == b""
