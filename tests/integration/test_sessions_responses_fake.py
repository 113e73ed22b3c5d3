"""Token-in sessions for Responses API calls on the fake vLLM: the same planner as chat (the
request converted to the chat conversation the server renders), exact prefixes, merged samples,
and every fallback with its reason."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.sessions_fake import Hook, extends, make_client, responder
from tito_agents.calls import Endpoint, SessionNote
from tito_agents.sessions import FallbackReason
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeResponse, FakeVLLM
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
INSTRUCTIONS = "You are a weather bot."


@pytest.fixture(scope="module")
def drift_fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=responder, tokenization="drift", drift_rate=0.5))


def responses_loop(
    client: openai.OpenAI, turns: int = 3, *, stream: bool = False, **kwargs: Any
) -> list[dict[str, Any]]:
    """An agent loop on the Responses API that appends only: each response's output items, then
    a function_call_output per function call, until the model answers in words."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    for _ in range(turns):
        ask = dict(model=MODEL_NAME, instructions=INSTRUCTIONS, input=items, tools=[TOOL])
        if stream:
            with client.responses.stream(**ask, **kwargs) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(**ask, **kwargs)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        for call in calls:
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": "18C, sunny"}
            )
    return items


@pytest.mark.parametrize("stream", [False, True])
def test_responses_sessions_keep_every_turn_an_exact_prefix(
    drift_fake: FakeVLLM, stream: bool
) -> None:
    """Each Responses prompt is the previous prompt + sampled ids + the template's tokens for the
    appended items, although the fake re-tokenizes sampled text differently (drift)."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        items = responses_loop(client, stream=stream)
    calls = ep.calls
    assert len(calls) == 2 and calls[0].tool_calls and not calls[1].tool_calls
    assert [c.endpoint for c in calls] == [Endpoint.RESPONSES] * 2
    assert [c.session for c in calls] == [SessionNote.FIRST, SessionNote.TOKEN_IN], [
        c.session_reason for c in calls
    ]
    assert extends(calls[0], calls[1])
    # the delta is what the template renders for the function_call_output (a tool message)
    tok = load_tokenizer()
    head = len(calls[0].prompt_ids) + len(calls[0].sampled_ids)
    delta = tok.decode(calls[1].prompt_ids[head:].tolist())
    assert "18C, sunny" in delta and delta.endswith("<|im_start|>assistant\n")
    assert items[-1]["type"] == "message"


def test_responses_episode_merges_into_one_exact_sample(drift_fake: FakeVLLM) -> None:
    """Merged assembly: an append-only Responses episode is one sample whose trained tokens are
    exactly every call's sampled ids; without sessions the drifted history splits it."""
    for sessions, expected in ((True, 1), (False, None)):
        collector = tito.Collector(assembly="merged", tokenizer=load_tokenizer())
        client = make_client(drift_fake, collector, sessions=sessions)
        with collector.episode() as ep:
            responses_loop(client)
        samples = captured_samples(collector)
        if expected is None:
            assert len(samples) > 1
            continue
        (sample,) = samples
        calls = sorted(ep.calls, key=lambda c: c.seq)
        want = np.concatenate((calls[-1].prompt_ids, calls[-1].sampled_ids))
        assert np.array_equal(sample.token_ids, want)
        trained = np.concatenate([c.sampled_ids for c in calls])
        assert np.array_equal(sample.token_ids[sample.loss_mask.astype(bool)], trained)


def test_chat_and_responses_turns_share_one_session(drift_fake: FakeVLLM) -> None:
    """A Responses call that extends a chat call of the same agent (the same conversation in
    chat form) is planned token-in too: one planner, one kind of turn."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        first = client.responses.create(model=MODEL_NAME, input="Hi there")
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[
                {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "And then?"},
            ],
        )
    assert ep.calls[1].session == SessionNote.TOKEN_IN, ep.calls[1].session_reason
    assert extends(ep.calls[0], ep.calls[1])


def test_rewritten_responses_history_falls_back(drift_fake: FakeVLLM) -> None:
    """Edited input items (the user turn, or the model's function call) are not append-only."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        items = responses_loop(client, turns=1)
        items.append({"type": "function_call_output", "call_id": "x", "output": "18C"})
        edited = copy.deepcopy(items)
        edited[0]["content"] = "Weather in Lima?"
        client.responses.create(model=MODEL_NAME, instructions=INSTRUCTIONS, input=edited)
        edited_call = copy.deepcopy(items)
        call = next(i for i in edited_call if i.get("type") == "function_call")
        call["arguments"] = '{"city": "Oslo"}'
        client.responses.create(
            model=MODEL_NAME, instructions=INSTRUCTIONS, input=edited_call, tools=[TOOL]
        )
    for call in ep.calls[1:]:
        assert call.session == SessionNote.FALLBACK
        assert FallbackReason.of(call.session_reason) is FallbackReason.NOT_APPEND_ONLY


def store_hook(stored: dict[str, list[Any]]) -> Hook:
    """A server that keeps conversation state (vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1): a
    request naming previous_response_id is answered as if its history were sent."""

    def hook(path: str, body: bytes) -> tuple[str, bytes]:
        if path.endswith("/responses"):
            payload = json.loads(body)
            previous = payload.pop("previous_response_id", None)
            if previous is not None:
                payload["input"] = [*stored[previous], {"role": "user", "content": "More?"}]
            body = json.dumps(payload).encode()
        return path, body

    return hook


def test_previous_response_id_falls_back_with_the_reason(drift_fake: FakeVLLM) -> None:
    """The server prepends history the client never sent: the call is rendered by the server,
    still captured exactly, and the reason says how to get token-in."""
    stored: dict[str, list[Any]] = {}
    collector = tito.Collector()
    client = make_client(drift_fake, collector, store_hook(stored))
    with collector.episode() as ep:
        first = client.responses.create(model=MODEL_NAME, input="Hi there")
        stored[first.id] = [
            {"role": "user", "content": "Hi there"},
            *(i.model_dump(exclude_none=True) for i in first.output),
        ]
        client.responses.create(model=MODEL_NAME, input="More?", previous_response_id=first.id)
    second = ep.calls[1]
    assert second.status is tito.CallStatus.COMPLETE
    assert second.session == SessionNote.FALLBACK
    assert FallbackReason.of(second.session_reason) is FallbackReason.NOT_A_CHAT_CONVERSATION
    assert "previous_response_id" in (second.session_reason or "")  # says which field


def test_server_ignoring_the_token_prompt_on_responses_is_detected(drift_fake: FakeVLLM) -> None:
    """A server that drops kv_transfer_params on /v1/responses is noticed from input_messages;
    later calls of the session do not try again."""

    def strip_token_in(path: str, body: bytes) -> tuple[str, bytes] | FakeResponse:
        if path.endswith("/responses"):
            payload = json.loads(body)
            payload.pop("kv_transfer_params", None)
            body = json.dumps(payload).encode()
        return path, body

    collector = tito.Collector()
    client = make_client(drift_fake, collector, strip_token_in)
    with collector.episode() as ep:
        items = responses_loop(client, turns=3)
        items.append({"role": "user", "content": "Thanks. And tomorrow?"})
        client.responses.create(model=MODEL_NAME, instructions=INSTRUCTIONS, input=items)
    assert ep.calls[1].session == SessionNote.FALLBACK
    reasons = [FallbackReason.of(c.session_reason) for c in ep.calls[1:3]]
    assert reasons == [
        FallbackReason.TOKEN_PROMPT_IGNORED,
        FallbackReason.SERVER_IGNORES_TOKEN_PROMPT,
    ]
    assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)


def test_items_the_conversion_does_not_cover_fall_back(drift_fake: FakeVLLM) -> None:
    """An input the chat conversion does not cover (here a custom tool) is rendered by the
    server, the reason on the call; the agent's call is unchanged."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        response = client.responses.create(
            model=MODEL_NAME,
            input="Hi",
            tools=[{"type": "custom", "name": "shell", "description": "Run a command."}],
        )
    assert response.output
    (call,) = ep.calls
    assert FallbackReason.of(call.session_reason) is FallbackReason.NOT_A_CHAT_CONVERSATION
    assert call.session == SessionNote.FALLBACK and "custom tool" in (call.session_reason or "")


def test_pairwise_prefixes_hold_over_a_longer_responses_conversation(
    drift_fake: FakeVLLM,
) -> None:
    """Tool call, answer, then a user turn and another tool round: every call extends the one
    before it."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        items = responses_loop(client)
        items.append({"role": "user", "content": "And in Lima?"})
        responses_loop_from(client, items)
    calls = ep.calls
    assert len(calls) >= 3
    assert all(c.session == SessionNote.TOKEN_IN for c in calls[1:]), [
        c.session_reason for c in calls
    ]
    for prev, nxt in itertools.pairwise(calls):
        assert extends(prev, nxt)


def responses_loop_from(client: openai.OpenAI, items: list[dict[str, Any]]) -> None:
    response = client.responses.create(
        model=MODEL_NAME, instructions=INSTRUCTIONS, input=items, tools=[TOOL]
    )
    items += [item.model_dump(exclude_none=True) for item in response.output]
