"""A failure anywhere in capture's request side never breaks the call nor leaves it counted in
flight: it goes out as the caller wrote it (counted uncaptured), a session call falls back with
the reason, and a call cancelled before it was sent is no longer in flight."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import openai
import pytest

import tito_agents as tito
from tito_agents._capture import core as capture_core
from tito_agents.calls import SessionNote
from tito_agents.sessions import FallbackReason
from tito_agents.testing.fake_vllm import FakeResponse, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

USER = [{"role": "user", "content": "Weather in Paris?"}]


class Cancelled(BaseException):
    """Stands in for a task cancellation (not an `Exception`)."""


@pytest.fixture(scope="module")
def fake() -> FakeVLLM:
    return FakeVLLM()


def client_of(fake: FakeVLLM, sent: list[bytes], *, cancel_tokenize: bool = False) -> Any:
    def handle(method: str, path: str, body: bytes, headers: Mapping[str, str]) -> FakeResponse:
        if path.endswith("/tokenize"):
            if cancel_tokenize:
                raise Cancelled
        else:
            sent.append(body)
        return fake.handle(method, path, body, headers)

    return openai.OpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(transport=mock_transport(handle)),
    )


def second_turn(client: Any, **extra: Any) -> Any:
    first = client.chat.completions.create(model=MODEL_NAME, messages=USER, **extra)
    messages = [
        *USER,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And tomorrow?"},
    ]
    return client.chat.completions.create(model=MODEL_NAME, messages=messages, **extra)


def test_an_internal_error_preparing_a_request_sends_it_uncaptured(
    fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a capture bug")

    monkeypatch.setattr(capture_core, "prepare_request", broken)
    sent: list[bytes] = []
    client = client_of(fake, sent)
    collector = tito.Collector()
    collector.wrap(client)
    with caplog.at_level(logging.WARNING, logger="tito_agents"), collector.episode() as ep:
        for _ in range(3):
            reply = client.chat.completions.create(model=MODEL_NAME, messages=USER)
            assert reply.choices[0].message.content
        assert ep.inflight == 0
    assert collector.stats.uncaptured_requests == 3 and collector.stats.requests == 0
    assert all(b"return_token_ids" not in body for body in sent)
    assert sum("sent uncaptured" in r.getMessage() for r in caplog.records) == 1


def test_a_failure_after_begin_sends_the_callers_request_and_is_not_in_flight(
    fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tito_agents._capture import flow as _flow

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("rebuild failed")

    monkeypatch.setattr(_flow, "_rebuild", broken)
    sent: list[bytes] = []
    client = client_of(fake, sent)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        client.chat.completions.create(model=MODEL_NAME, messages=USER)
        assert ep.inflight == 0
    assert b"return_token_ids" not in sent[0]
    assert collector.stats.uncaptured_requests == 1 and collector.stats.requests == 0


def test_a_token_prompt_that_cannot_be_added_falls_back(
    fake: FakeVLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("cannot splice")

    monkeypatch.setattr(capture_core, "with_token_prompt", broken)
    sent: list[bytes] = []
    client = client_of(fake, sent)
    collector = tito.Collector()
    collector.wrap(client, sessions=True)
    with collector.episode() as ep:
        second_turn(client)
        assert ep.inflight == 0
    last = ep.last_call
    assert last is not None and last.session is SessionNote.FALLBACK
    assert FallbackReason.of(last.session_reason) is FallbackReason.TOKEN_PROMPT_NOT_ADDED
    assert b"kv_transfer_params" not in sent[-1]


def test_a_call_cancelled_while_its_session_is_planned_is_not_in_flight(fake: FakeVLLM) -> None:
    sent: list[bytes] = []
    client = client_of(fake, sent, cancel_tokenize=True)
    collector = tito.Collector()
    collector.wrap(client, sessions=True)
    with pytest.raises(Cancelled), collector.episode() as ep:
        try:
            second_turn(client)
        finally:
            assert ep.inflight == 0
    assert len(sent) == 1  # the second turn was never sent


@pytest.mark.parametrize(
    "kv",
    ["x", 5, [], {"prompt_token_ids": [1, 2, 3]}],
    ids=str,
)
def test_odd_kv_transfer_params_fall_back_with_the_reason(fake: FakeVLLM, kv: Any) -> None:
    sent: list[bytes] = []
    client = client_of(fake, sent)
    collector = tito.Collector()
    collector.wrap(client, sessions=True)
    with collector.episode() as ep:
        first = client.chat.completions.create(model=MODEL_NAME, messages=USER)
        messages = [
            *USER,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And tomorrow?"},
        ]
        try:
            client.chat.completions.create(
                model=MODEL_NAME, messages=messages, extra_body={"kv_transfer_params": kv}
            )
        except openai.BadRequestError:
            assert not isinstance(kv, dict)  # the server refuses what is not an object
        assert ep.inflight == 0
    assert json.loads(sent[-1])["kv_transfer_params"] == kv  # sent as written


def test_big_integers_in_tools_fall_back_and_reach_the_server_unchanged(fake: FakeVLLM) -> None:
    big = 123456789012345678901234567890
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"x": {"maximum": big}}},
            },
        }
    ]
    sent: list[bytes] = []
    client = client_of(fake, sent)
    collector = tito.Collector()
    collector.wrap(client, sessions=True)
    with collector.episode() as ep:
        second_turn(client, tools=tools, tool_choice="none")
    last = ep.last_call
    assert last is not None and last.session is SessionNote.FALLBACK
    assert FallbackReason.of(last.session_reason) is FallbackReason.WIDE_INTEGERS
    assert all(str(big).encode() in body for body in sent)
