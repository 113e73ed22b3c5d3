"""What the agent sees: exactly the response an unwrapped client gets.

Capture adds `return_token_ids` (and, with `capture_logprobs`, `logprobs`) to the request; vLLM
then fills fields the caller never asked for. A non-streaming response reaches the caller with those
fields null again, as vLLM sends them when not asked, while the call record keeps everything. What
the caller asked for itself is left alone.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

import tito_agents as tito
from tito_agents._capture.wire import ResponseParser, prepare_request
from tito_agents.calls import Endpoint
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

ANSWER = "It is sunny in Paris, with a light breeze from the west."
SHORT = [{"role": "user", "content": "Weather in Paris?"}]
# long enough that the response takes the fast path (id arrays cut out of the body)
LONG = [{"role": "user", "content": "Weather in Paris? " * 300}]


@pytest.fixture(scope="module")
def fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=lambda view: ANSWER))


def client_for(fake: FakeVLLM) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        http_client=openai.DefaultHttpxClient(transport=mock_transport(fake)),
    )


def comparable(response: Any) -> dict[str, Any]:
    """The response without what differs between any two calls (id, creation time)."""
    data: dict[str, Any] = response.model_dump()
    for key in ("id", "created"):
        data.pop(key)
    return data


def both(fake: FakeVLLM, chat: bool, *, capture_logprobs: bool, **kwargs: Any) -> Any:
    """The same request through an unwrapped and a wrapped client, and the wrapped call record."""
    plain = client_for(fake)
    collector = tito.Collector(capture_logprobs=capture_logprobs)
    wrapped = collector.wrap(client_for(fake))

    def create(client: openai.OpenAI) -> Any:
        endpoint: Any = client.chat.completions if chat else client.completions
        return endpoint.create(model=MODEL_NAME, max_tokens=16, temperature=0, **kwargs)

    with collector.episode() as ep:
        got = create(wrapped)
    want = create(plain)
    (call,) = ep.calls
    return want, got, call


@pytest.mark.parametrize("messages", [SHORT, LONG], ids=["short", "long"])
@pytest.mark.parametrize("capture_logprobs", [False, True])
def test_chat_caller_sees_the_unwrapped_response(
    fake: FakeVLLM, messages: list[dict[str, str]], capture_logprobs: bool
) -> None:
    want, got, call = both(fake, True, capture_logprobs=capture_logprobs, messages=messages)
    assert comparable(got) == comparable(want)
    assert got.model_extra["prompt_token_ids"] is None
    assert got.choices[0].model_extra["token_ids"] is None and got.choices[0].logprobs is None
    # ... while the record holds the exact ids (and the logprobs capture asked for)
    assert call.status is tito.CallStatus.COMPLETE and call.prompt_ids.shape[0] > 0
    assert call.sampled_ids.shape[0] > 0
    assert (call.logprobs is not None) is capture_logprobs


def test_completions_caller_sees_the_unwrapped_response(fake: FakeVLLM) -> None:
    want, got, call = both(fake, False, capture_logprobs=True, prompt="The weather in Paris is")
    assert comparable(got) == comparable(want)
    assert got.choices[0].model_extra["prompt_token_ids"] is None
    assert got.choices[0].logprobs is None
    assert call.prompt_ids.shape[0] > 0 and call.logprobs is not None


def test_what_the_caller_asked_for_is_kept(fake: FakeVLLM) -> None:
    """Ids and logprobs the caller requested itself reach it unchanged."""
    want, got, call = both(
        fake,
        True,
        capture_logprobs=True,
        messages=LONG,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert comparable(got) == comparable(want)
    assert got.model_extra["prompt_token_ids"] == call.prompt_ids.tolist()
    assert got.choices[0].model_extra["token_ids"] == call.sampled_ids.tolist()
    assert len(got.choices[0].logprobs.content) == call.sampled_ids.shape[0]


def test_a_body_capture_cannot_parse_is_passed_on_as_it_came() -> None:
    prepared = prepare_request(Endpoint.CHAT, b'{"messages": []}', capture_logprobs=True)
    assert prepared is not None
    _, info = prepared
    parser = ResponseParser(info)
    with pytest.raises(tito.errors.MalformedResponseError):
        parser.parse_body(b'{"choices": [')
    assert parser.caller_body() is None


def test_nothing_added_means_nothing_rewritten() -> None:
    request = b'{"messages": [], "return_token_ids": true, "logprobs": true}'
    prepared = prepare_request(Endpoint.CHAT, request, capture_logprobs=True)
    assert prepared is not None and prepared[0] is None  # the request went out unchanged
    parser = ResponseParser(prepared[1])
    parser.parse_body(
        b'{"choices": [{"index": 0, "token_ids": [5], "logprobs": {"content": '
        b'[{"logprob": -0.5}]}}], "prompt_token_ids": [1, 2]}'
    )
    assert parser.caller_body() is None


async def test_async_caller_sees_the_unwrapped_response(fake: FakeVLLM) -> None:
    def client() -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=mock_transport(fake)),
        )

    collector = tito.Collector(capture_logprobs=True)
    plain, wrapped = client(), collector.wrap(client())
    async with collector.episode() as ep:
        got = await wrapped.chat.completions.create(
            model=MODEL_NAME, messages=LONG, max_tokens=16, temperature=0
        )
    want = await plain.chat.completions.create(
        model=MODEL_NAME, messages=LONG, max_tokens=16, temperature=0
    )
    assert comparable(got) == comparable(want)
    assert want.usage is not None
    assert ep.calls[0].sampled_ids.shape[0] == want.usage.completion_tokens


@pytest.mark.parametrize(
    "asked",
    [{"extra_body": {"return_token_ids": True}}, {"logprobs": True}],
    ids=["ids-asked", "logprobs-asked"],
)
def test_what_was_asked_is_kept_beside_what_was_added(
    fake: FakeVLLM, asked: dict[str, Any]
) -> None:
    """The caller asked for one of the two, capture added the other: only the added one is null."""
    want, got, call = both(fake, True, capture_logprobs=True, messages=LONG, **asked)
    assert comparable(got) == comparable(want)
    if "extra_body" in asked:
        assert got.model_extra["prompt_token_ids"] == call.prompt_ids.tolist()
        assert got.choices[0].logprobs is None
    else:
        assert got.model_extra["prompt_token_ids"] is None
        assert len(got.choices[0].logprobs.content) == call.sampled_ids.shape[0]
