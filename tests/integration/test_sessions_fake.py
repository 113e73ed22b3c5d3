"""Token-in sessions on the fake vLLM: exact prefixes, bridges, branches and every fallback."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from typing import Any

import numpy as np
import openai
import orjson
import pytest

import tito_agents as tito
from tests.support.sessions_fake import extends, make_client, recording_hook, responder
from tests.support.weather import WEATHER_TOOLS
from tito_agents._capture.sessions import TAIL_HEAD
from tito_agents.calls import SessionNote
from tito_agents.sessions import FallbackReason
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import (
    FakeConfig,
    FakeResponse,
    FakeVLLM,
    mock_transport,
)
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

TOOLS = WEATHER_TOOLS  # the weather agent's tool, as the sessions tests send it


def tool_loop(client: openai.OpenAI, turns: int = 3, **kwargs: Any) -> list[dict[str, Any]]:
    """An agent loop that appends only: assistant turn, tool result, ..., final answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    for _ in range(turns):
        response = client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=TOOLS, **kwargs
        )
        message = response.choices[0].message
        messages.append(
            message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        )
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C, sunny"})
    return messages


@pytest.fixture(scope="module")
def drift_fake() -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=responder, tokenization="drift", drift_rate=0.5))


def test_without_sessions_drifted_history_breaks_the_prefix(drift_fake: FakeVLLM) -> None:
    """Baseline: the server re-renders sampled text, so the next prompt does not extend it."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector, sessions=False)
    with collector.episode() as ep:
        tool_loop(client)
    first, second = ep.calls[:2]
    assert not extends(first, second)
    assert first.session is None


def test_sessions_keep_every_turn_an_exact_prefix(drift_fake: FakeVLLM) -> None:
    """With sessions each prompt is the previous prompt + the sampled ids + the new tokens."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        messages = tool_loop(client)
    calls = ep.calls
    assert [c.session for c in calls] == [SessionNote.FIRST] + [SessionNote.TOKEN_IN] * (
        len(calls) - 1
    )
    # the notes are Enum members that still equal, print and serialize as the documented strings
    assert [c.session for c in calls[:2]] == ["first", "token_in"]
    assert isinstance(calls[1].session, SessionNote) and f"{calls[1].session}" == "token_in"
    assert orjson.dumps(calls[1].session) == b'"token_in"'
    for prev, nxt in itertools.pairwise(calls):
        assert extends(prev, nxt), nxt.session_reason
    # the delta is exactly what the server's template renders for the appended messages
    tok = load_tokenizer()
    last = calls[-1]
    head = len(calls[-2].prompt_ids) + len(calls[-2].sampled_ids)
    full = tok.apply_chat_template(
        messages[:-1], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert tok.decode(last.prompt_ids[head:].tolist()) in full


def test_truncated_turn_is_bridged_with_the_end_of_turn_token(drift_fake: FakeVLLM) -> None:
    """A turn cut by max_tokens gets the end-of-turn token as context before the next message."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hello?"}]
    with collector.episode() as ep:
        for max_tokens in (64, 3, 64):  # stop, then length, then a continuation
            response = client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=max_tokens
            )
            messages += [
                {"role": "assistant", "content": response.choices[0].message.content},
                {"role": "user", "content": "Go on."},
            ]
    stop, cut, after = ep.calls
    assert (stop.finish_reason, cut.finish_reason) == ("stop", "length")
    assert after.session == SessionNote.TOKEN_IN_BRIDGED
    head = np.concatenate((cut.prompt_ids, cut.sampled_ids, [2]))
    assert np.array_equal(after.prompt_ids[: head.shape[0]], head)


def test_retry_of_the_same_messages_is_a_sibling_branch(drift_fake: FakeVLLM) -> None:
    """Sending the same messages again reuses the earlier token prompt: a resample, not a break."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with collector.episode() as ep:
        client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
        client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS, seed=2)
    first, retry = ep.calls
    assert retry.session == SessionNote.RESAMPLE
    assert np.array_equal(first.prompt_ids, retry.prompt_ids)


def test_rewritten_history_falls_back_with_a_reason(drift_fake: FakeVLLM) -> None:
    """An agent that trims or edits history gets server rendering and the reason on the call."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode() as ep:
        messages = tool_loop(client, turns=2)
        edited = copy.deepcopy(messages)
        edited[0]["content"] = "Weather in Lima?"  # history rewritten
        client.chat.completions.create(model=MODEL_NAME, messages=edited, tools=TOOLS)
        edited_answer = copy.deepcopy(messages)
        edited_answer[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Oslo"}'
        client.chat.completions.create(model=MODEL_NAME, messages=edited_answer, tools=TOOLS)
    rewritten, edited_call = ep.calls[-2:]
    for call in (rewritten, edited_call):
        assert call.session == SessionNote.FALLBACK
        assert FallbackReason.of(call.session_reason) is FallbackReason.NOT_APPEND_ONLY


def test_non_prefix_preserving_template_falls_back() -> None:
    """A template that renders earlier turns differently once more are appended is detected."""
    tokenizer = copy.deepcopy(load_tokenizer())
    # a template that drops the content of every assistant turn but the last (like templates that
    # strip earlier reasoning): appending a message changes how the previous turn renders
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content or '' }}"
        "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fake = FakeVLLM(FakeConfig(responder=responder, tokenizer=tokenizer))
    collector = tito.Collector()
    client = make_client(fake, collector)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    with collector.episode() as ep:
        answer = client.chat.completions.create(model=MODEL_NAME, messages=messages)
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ]
        client.chat.completions.create(model=MODEL_NAME, messages=messages)
    second = ep.calls[1]
    assert second.session == SessionNote.FALLBACK
    assert FallbackReason.of(second.session_reason) is FallbackReason.PREFIX_NOT_PRESERVED


def test_server_without_tokenize_falls_back(drift_fake: FakeVLLM) -> None:
    """No /tokenize on the server: every later call is rendered by the server, with the reason."""

    def no_tokenize(path: str, body: bytes) -> tuple[str, bytes] | FakeResponse:
        if path == "/tokenize":
            return FakeResponse(
                404, [("content-type", "application/json")], b'{"detail":"Not Found"}'
            )
        return path, body

    collector = tito.Collector()
    client = make_client(drift_fake, collector, no_tokenize)
    with collector.episode() as ep:
        tool_loop(client, turns=2)
    assert ep.calls[1].session == SessionNote.FALLBACK
    assert FallbackReason.of(ep.calls[1].session_reason) is FallbackReason.TOKENIZE_FAILED
    assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)


def test_server_ignoring_the_token_prompt_is_detected(drift_fake: FakeVLLM) -> None:
    """A server that drops kv_transfer_params (vLLM < 0.27) is noticed; later calls don't try."""

    def strip_token_in(path: str, body: bytes) -> tuple[str, bytes]:
        if path.endswith("/chat/completions"):
            payload = json.loads(body)
            payload.pop("kv_transfer_params", None)
            body = json.dumps(payload).encode()
        return path, body

    collector = tito.Collector()
    client = make_client(drift_fake, collector, strip_token_in)
    with collector.episode() as ep:
        messages = tool_loop(client, turns=3)
        messages.append({"role": "user", "content": "Thanks. And tomorrow?"})
        client.chat.completions.create(model=MODEL_NAME, messages=messages, tools=TOOLS)
    assert ep.calls[1].session == SessionNote.FALLBACK
    reasons = [FallbackReason.of(c.session_reason) for c in ep.calls[1:3]]
    assert reasons == [
        FallbackReason.TOKEN_PROMPT_IGNORED,
        FallbackReason.SERVER_IGNORES_TOKEN_PROMPT,
    ]


async def test_async_streaming_sessions(drift_fake: FakeVLLM) -> None:
    """Streaming async calls keep exact prefixes too (the assistant message is rebuilt from
    deltas to check append-only)."""
    collector = tito.Collector()
    client = collector.wrap(
        openai.AsyncOpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultAsyncHttpxClient(transport=mock_transport(drift_fake)),
        ),
        sessions=True,
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    async with collector.episode() as ep:
        for _ in range(2):
            stream = await client.chat.completions.create(
                model=MODEL_NAME, messages=messages, tools=TOOLS, stream=True
            )
            content, calls = "", {}
            async for chunk in stream:
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    for tc in choice.delta.tool_calls or []:
                        slot = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                        slot["id"] = tc.id or slot["id"]
                        slot["name"] += tc.function.name or "" if tc.function else ""
                        slot["args"] += (tc.function.arguments or "") if tc.function else ""
            tool_calls = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
            messages.append(
                {
                    "role": "assistant",
                    "content": content or None,
                    **({"tool_calls": tool_calls} if tool_calls else {}),
                }
            )
            for c in tool_calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": "sunny"})
        await asyncio.sleep(0)
    await client.close()
    first, second = ep.calls
    assert second.session == SessionNote.TOKEN_IN, second.session_reason
    assert extends(first, second)


def test_sessions_and_merged_assembly_give_one_exact_sample_per_agent(
    drift_fake: FakeVLLM,
) -> None:
    """With sessions, an append-only episode merges into one sample per agent whose tokens are
    the first prompt, then each turn's sampled ids and prompt delta; without, it splits."""
    for sessions, expected in ((True, 1), (False, None)):
        collector = tito.Collector(assembly="merged", tokenizer=load_tokenizer())
        client = make_client(drift_fake, collector, sessions=sessions)
        with collector.episode() as ep:
            with tito.agent("solver"):
                tool_loop(client)
            with tito.agent("checker"):
                client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": "Check it."}]
                )
        samples = captured_samples(collector)
        solver = [s for s in samples if s.agent == "solver"]
        if expected is not None:
            assert len(solver) == expected and ep.divergences == []
            (sample,) = solver
            calls = sorted((c for c in ep.calls if c.agent == "solver"), key=lambda c: c.seq)
            want = np.concatenate((calls[-1].prompt_ids, calls[-1].sampled_ids))
            assert np.array_equal(sample.token_ids, want)
            trained = np.concatenate([c.sampled_ids for c in calls])
            assert np.array_equal(sample.token_ids[sample.loss_mask.astype(bool)], trained)
        else:
            assert len(solver) > 1
            assert ep.report.divergences  # each break is reported by kind
        assert len([s for s in samples if s.agent == "checker"]) == 1


def test_end_of_turn_learnt_in_one_episode_serves_the_next(drift_fake: FakeVLLM) -> None:
    """An episode whose first turn is truncated is bridged with the end-of-turn id an earlier
    episode of the same model learnt; session_ms records the latency the session added."""
    collector = tito.Collector()
    client = make_client(drift_fake, collector)
    with collector.episode():
        tool_loop(client, turns=2)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hello?"}]
    with collector.episode() as ep:
        cut = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=3)
        messages += [
            {"role": "assistant", "content": cut.choices[0].message.content},
            {"role": "user", "content": "Go on."},
        ]
        client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8)
    first, second = ep.calls
    assert first.finish_reason == "length"
    assert second.session == SessionNote.TOKEN_IN_BRIDGED
    assert second.session_ms is not None and second.session_ms >= 0.0


def rendered_delta(tok: Any, messages: list[dict[str, Any]], k: int, **kwargs: Any) -> str:
    """The text the template adds after the end-of-turn token of turn `k` (the assistant turn)
    for messages[k + 1:]."""
    before = tok.apply_chat_template(messages[: k + 1], tokenize=False, **kwargs)
    before = before[: before.rindex("<|im_end|>") + len("<|im_end|>")]
    after = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    assert after.startswith(before)
    return str(after[len(before) :])


def test_checked_tail_kinds_need_only_the_short_render(drift_fake: FakeVLLM) -> None:
    """The first tail of a kind is checked with three renders; later tails of that kind send one
    short render (fixed head, previous assistant turn, new messages, no tools) whose delta is
    exactly what the whole conversation renders."""
    asks: list[dict[str, Any]] = []
    collector = tito.Collector()
    client = make_client(drift_fake, collector, recording_hook(asks))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    per_call: list[int] = []
    with collector.episode() as ep:
        for step in range(4):  # tool call, answer, tool call, answer
            seen = len(asks)
            response = client.chat.completions.create(
                model=MODEL_NAME, messages=messages, tools=TOOLS
            )
            per_call.append(len(asks) - seen)
            message = response.choices[0].message
            messages.append(
                message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
            )
            for call in message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C"})
            if step == 1:
                messages.append({"role": "user", "content": "And in Lima?"})
    calls = ep.calls
    # first call: none; [tool]: end-of-turn derived (3 tiny renders) and checked (3);
    # [assistant, user]: checked (3); [tool] again: short (1)
    assert per_call == [0, 6, 3, 1]
    assert [c.session for c in calls[1:]] == [SessionNote.TOKEN_IN] * 3
    short = asks[-1]
    assert short["messages"][0] == TAIL_HEAD and "tools" not in short
    assert short["messages"][1]["role"] == "assistant" and len(short["messages"]) == 3
    for prev, nxt in itertools.pairwise(calls):
        assert extends(prev, nxt), nxt.session_reason
    tok = load_tokenizer()
    k = len(messages) - 3  # the last request ended with [assistant tool call, tool result]
    head = len(calls[2].prompt_ids) + len(calls[2].sampled_ids)
    delta = tok.decode(calls[3].prompt_ids[head:].tolist())
    assert delta == rendered_delta(tok, messages[:-1], k, tools=TOOLS)


@pytest.mark.parametrize(
    "quirk",
    [
        # numbers each turn: prefix-preserving, but a short render numbers the new turn differently
        "{% for m in messages %}<|im_start|>{{ m.role }} {{ loop.index }}\n",
        # refuses a conversation that does not open with a system turn: the short render fails
        "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n",
    ],
)
def test_tail_kinds_the_short_render_misrenders_use_the_whole_conversation(quirk: str) -> None:
    """Where the short render does not end with the checked delta, later tails of that kind are
    cut from one render of the whole conversation, and stay exact."""
    tokenizer = copy.deepcopy(load_tokenizer())
    tokenizer.chat_template = (
        quirk + "{{ m.content or '' }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fake = FakeVLLM(FakeConfig(responder=lambda view: "Sunny all week.", tokenizer=tokenizer))
    asks: list[dict[str, Any]] = []
    collector = tito.Collector()
    client = make_client(fake, collector, recording_hook(asks))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    with collector.episode() as ep:
        for question in ("Weather?", "Tomorrow?", "And after?"):
            messages.append({"role": "user", "content": question})
            response = client.chat.completions.create(model=MODEL_NAME, messages=messages)
            messages.append({"role": "assistant", "content": response.choices[0].message.content})
    first, checked, later = ep.calls
    assert (checked.session, later.session) == (SessionNote.TOKEN_IN, SessionNote.TOKEN_IN)
    assert extends(first, checked) and extends(checked, later)
    assert asks[-1]["messages"] == messages[:-1]  # the whole conversation, rendered once
    head = len(checked.prompt_ids) + len(checked.sampled_ids)
    k = len(messages) - 3
    assert tokenizer.decode(later.prompt_ids[head:].tolist()) == rendered_delta(
        tokenizer, messages[:-1], k
    )
