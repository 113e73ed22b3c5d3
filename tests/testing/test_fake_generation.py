"""Behaviour of the fake's generation core, through the pure `FakeVLLM.handle` (no sockets)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.fake_vllm_calls import MESSAGES, WEATHER_TOOL, call, stream_token_ids
from tito_agents.testing import EOS_ID, FakeConfig, FakeVLLM, RequestView, hermes_tool_call

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"


def _fake(say: str | Sequence[int], **config: Any) -> FakeVLLM:
    return FakeVLLM(FakeConfig(responder=lambda view: say, **config))


def _chat(fake: FakeVLLM, **fields: Any) -> dict[str, Any]:
    result = call(fake, CHAT, {"messages": MESSAGES, "return_token_ids": True, **fields})
    assert result.status == 200, result.raw
    return result.body  # type: ignore[no-any-return]


def _chat_stream(fake: FakeVLLM, **fields: Any) -> list[dict[str, Any]]:
    body = {"messages": MESSAGES, "return_token_ids": True, "stream": True, **fields}
    result = call(fake, CHAT, body)
    assert result.status == 200, result.raw
    return result.chunks


def _streamed_text(chunks: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if c["choices"] and c["choices"][0]["index"] == index
    )


# -- ids, usage, streams -------------------------------------------------------------------------


def test_token_ids_count_matches_usage_and_logprobs(fake: FakeVLLM) -> None:
    """Every sampled id (EOS included) is in token_ids, has a logprob and is counted in usage."""
    body = _chat(fake, n=3, temperature=1.0, seed=7, logprobs=True, top_logprobs=2)
    total = 0
    for choice in body["choices"]:
        assert choice["token_ids"][-1] == EOS_ID
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
        total += len(choice["token_ids"])
    assert body["usage"]["completion_tokens"] == total
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"n": 2, "temperature": 1.0, "seed": 3},
        {"tools": [WEATHER_TOOL]},
        {"stop": ["depend", "answer"], "max_tokens": 30},
        {"logprobs": True, "top_logprobs": 1},
    ],
    ids=["plain", "n2", "tools", "stop", "logprobs"],
)
def test_streamed_ids_and_text_equal_the_non_stream_ones(fake: FakeVLLM, fields: Any) -> None:
    """For the same request and seed, streamed delta ids and text concatenate to the body's."""
    body = _chat(fake, **fields)
    chunks = _chat_stream(fake, stream_options={"include_usage": True}, **fields)
    streamed = stream_token_ids(chunks)
    for choice in body["choices"]:
        assert streamed[choice["index"]] == choice["token_ids"]
        if not choice["message"].get("tool_calls"):
            assert _streamed_text(chunks, choice["index"]) == choice["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == body["usage"]["completion_tokens"]


def test_completions_stream_matches_non_stream(fake: FakeVLLM) -> None:
    """Completions streams carry the same ids and text as the body, per prompt and choice."""
    fields = {"prompt": ["hello world", "the sky is"], "n": 2, "seed": 1, "max_tokens": 12}
    body = call(fake, CMPL, {**fields, "return_token_ids": True}).body
    chunks = call(fake, CMPL, {**fields, "return_token_ids": True, "stream": True}).chunks
    streamed = stream_token_ids(chunks)
    texts: dict[int, str] = {}
    for chunk in chunks:
        choice = chunk["choices"][0]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    for choice in body["choices"]:
        assert streamed[choice["index"]] == choice["token_ids"]
        assert texts[choice["index"]] == choice["text"]
    assert body["usage"]["prompt_tokens"] == 2 + 3


def test_chat_prompt_is_rendered_like_vllm(fake: FakeVLLM, tokenizer: Any) -> None:
    """Chat prompt ids are the template render (tool arguments json-loaded), encoded plainly."""
    call_ = {"id": "c1", "type": "function"}
    call_["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}  # type: ignore[assignment]
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call_]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    body = _chat(fake, messages=messages, tools=[WEATHER_TOOL], max_tokens=3)
    loaded = json.loads(json.dumps(messages))
    loaded[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    text = tokenizer.apply_chat_template(
        loaded, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False
    )
    assert body["prompt_token_ids"] == tokenizer.encode(text, add_special_tokens=False)
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    tokenized = call(fake, "/tokenize", {"messages": messages, "tools": [WEATHER_TOOL]}).body
    assert tokenized["tokens"] == body["prompt_token_ids"]
    assert tokenized["count"] == body["usage"]["prompt_tokens"]


def test_token_in_replaces_the_rendered_prompt() -> None:
    """kv_transfer_params.prompt_token_ids become the prompt; the responder sees those ids."""
    seen: list[RequestView] = []

    def responder(view: RequestView) -> str:
        seen.append(view)
        return "ok"

    fake = FakeVLLM(FakeConfig(responder=responder))
    ids = [1, 4093, 198, 5588, 2, 198, 1, 520, 9531, 198]
    body = _chat(fake, kv_transfer_params={"prompt_token_ids": ids})
    assert body["prompt_token_ids"] == ids
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["kv_transfer_params"] is None
    assert seen[0].prompt_ids == tuple(ids)
    bad = call(fake, CHAT, {"messages": MESSAGES, "kv_transfer_params": {"prompt_token_ids": [-1]}})
    assert bad.status == 400
    assert bad.body["error"]["param"] == "kv_transfer_params.prompt_token_ids"


# -- ending: EOS, length, stop tokens, stop strings ----------------------------------------------


def test_natural_end_appends_eos_and_length_does_not(tokenizer: Any) -> None:
    """A finished answer ends with EOS (finish "stop"); max_tokens cuts without EOS ("length")."""
    fake = _fake("Hello there, friend.")
    ids = tokenizer.encode("Hello there, friend.", add_special_tokens=False)
    done = _chat(fake)["choices"][0]
    assert done["token_ids"] == [*ids, EOS_ID]
    assert (done["finish_reason"], done["stop_reason"]) == ("stop", None)
    assert done["message"]["content"] == "Hello there, friend."
    cut = _chat(fake, max_tokens=2)["choices"][0]
    assert cut["token_ids"] == ids[:2]
    assert cut["finish_reason"] == "length"


def test_stop_token_is_included_and_its_text_is_not(tokenizer: Any) -> None:
    """stop_token_ids: the stop id ends token_ids, stop_reason is that int, the text omits it."""
    fake = _fake("one two three four")
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    choice = _chat(fake, stop_token_ids=[ids[2]])["choices"][0]
    assert choice["token_ids"] == ids[:3]
    assert choice["stop_reason"] == ids[2]
    assert choice["message"]["content"] == "one two"


def test_stop_strings_trim_truncate_or_keep_the_text() -> None:
    """A stop string ends generation on the token completing it; the text is cut at the match."""
    fake = _fake("The function returns quickly.")
    trimmed = _chat(fake, stop=["returns"])["choices"][0]
    assert trimmed["message"]["content"] == "The function "
    assert trimmed["stop_reason"] == "returns"
    kept = _chat(fake, stop=["returns"], include_stop_str_in_output=True)["choices"][0]
    assert kept["message"]["content"] == "The function returns"
    assert kept["token_ids"] == trimmed["token_ids"]
    mid = _chat(fake, stop=["ncti"])["choices"][0]  # inside a token: text != decode(ids)
    assert mid["message"]["content"] == "The fu"
    assert mid["finish_reason"] == "stop"


def test_stop_string_text_is_held_back_in_streams() -> None:
    """While a stop string may still match, streamed text lags behind the tokens (vLLM's buffer)."""
    fake = _fake("The function returns quickly.")
    chunks = _chat_stream(fake, stop=["returns"])
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks[1:]]
    assert "".join(d or "" for d in deltas) == "The function "
    assert deltas[0] != "The"  # held back: "returns" is 7 characters, 6 are withheld


def test_textless_chunks_are_sent_only_when_ids_or_logprobs_are_asked_for() -> None:
    """A token that releases no text (inside a character) gets a `{}` chunk only with ids/logprobs."""
    fake = _fake("Hi 😀 ok")
    with_ids = _chat_stream(fake)
    body = {"messages": MESSAGES, "stream": True}
    plain = call(fake, CHAT, body).chunks
    assert {} in [c["choices"][0]["delta"] for c in with_ids[1:]]
    assert len(plain) == len(with_ids) - 1
    assert _streamed_text(plain) == _streamed_text(with_ids) == "Hi 😀 ok"
    with_logprobs = call(fake, CHAT, {**body, "logprobs": True}).chunks
    assert len(with_logprobs) == len(with_ids)


def test_return_prompt_text_gives_the_rendered_template(fake: FakeVLLM, tokenizer: Any) -> None:
    """return_prompt_text (0.32) returns the rendered prompt; it is null otherwise."""
    body = _chat(fake, return_prompt_text=True, max_tokens=1)
    assert body["prompt_text"].endswith("<|im_start|>assistant\n")
    assert (
        tokenizer.encode(body["prompt_text"], add_special_tokens=False) == body["prompt_token_ids"]
    )
    role_chunk = _chat_stream(fake, return_prompt_text=True, max_tokens=1)[0]
    assert role_chunk["prompt_text"] == body["prompt_text"]
    assert _chat(fake, max_tokens=1)["prompt_text"] is None


# -- choices, seeds, logprobs --------------------------------------------------------------------


def test_choices_differ_by_index_and_repeat_by_seed(fake: FakeVLLM) -> None:
    """n>1 gives different (deterministic) answers; a seed repeats them; greedy ignores seeds."""
    first = _chat(fake, n=4, temperature=1.0, seed=11)
    again = _chat(fake, n=4, temperature=1.0, seed=11)
    texts = [c["message"]["content"] for c in first["choices"]]
    assert texts == [c["message"]["content"] for c in again["choices"]]
    assert len(set(texts)) > 1
    greedy = [_chat(fake, temperature=0, seed=seed)["choices"][0]["token_ids"] for seed in (1, 2)]
    assert greedy[0] == greedy[1]


def test_logprobs_list_the_sampled_token_first(fake: FakeVLLM, tokenizer: Any) -> None:
    """Each logprob entry: the sampled token's text, bytes and value, first in top_logprobs."""
    choice = _chat(fake, logprobs=True, top_logprobs=3, max_tokens=8)["choices"][0]
    for token_id, entry in zip(choice["token_ids"], choice["logprobs"]["content"], strict=True):
        text = tokenizer.decode([token_id])
        assert entry["token"] == text
        assert entry["bytes"] == list(text.encode())
        assert -10 < entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0] == {k: entry[k] for k in ("token", "logprob", "bytes")}


def test_token_id_mode_keeps_vllms_bytes_quirk(fake: FakeVLLM, tokenizer: Any) -> None:
    """return_tokens_as_token_ids: "token_id:N" strings; outer bytes are the decoded text's."""
    choice = _chat(fake, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)["choices"][
        0
    ]
    entry, token_id = choice["logprobs"]["content"][0], choice["token_ids"][0]
    assert entry["token"] == f"token_id:{token_id}"
    assert entry["bytes"] == list(tokenizer.decode([token_id]).encode())
    assert entry["top_logprobs"][0]["bytes"] == list(f"token_id:{token_id}".encode())


def test_rescoring_with_prompt_logprobs_reproduces_sampling_logprobs(fake: FakeVLLM) -> None:
    """Scoring prompt + sampled ids via /v1/completions prompt_logprobs gives the same values."""
    body = _chat(fake, logprobs=True, max_tokens=12, temperature=1.0, seed=5)
    prompt, choice = body["prompt_token_ids"], body["choices"][0]
    sampled = [e["logprob"] for e in choice["logprobs"]["content"]]
    ids = prompt + choice["token_ids"]
    rescored = call(fake, CMPL, {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}).body
    positions = rescored["choices"][0]["prompt_logprobs"][len(prompt) :]
    assert [
        p[str(t)]["logprob"] for p, t in zip(positions, choice["token_ids"], strict=True)
    ] == sampled


def test_completions_echo_quirk_and_legacy_logprobs(fake: FakeVLLM) -> None:
    """echo prepends the prompt text unless return_token_ids is set; legacy logprobs cover both."""
    fields = {"prompt": "hello world", "max_tokens": 4, "echo": True, "logprobs": 2}
    plain = call(fake, CMPL, fields).body["choices"][0]
    with_ids = call(fake, CMPL, {**fields, "return_token_ids": True}).body["choices"][0]
    assert plain["text"].startswith("hello world")
    assert with_ids["text"] == plain["text"][len("hello world") :]
    legacy = with_ids["logprobs"]
    assert len(legacy["tokens"]) == len(with_ids["prompt_token_ids"]) + len(with_ids["token_ids"])
    assert legacy["token_logprobs"][0] is None and legacy["top_logprobs"][0] is None
    assert all(len(top) <= 3 for top in legacy["top_logprobs"][1:])
    assert with_ids["prompt_logprobs"][0] is None


def test_token_prompts_are_echoed_per_choice(fake: FakeVLLM) -> None:
    """Token-id prompts come back per choice in prompt_token_ids; usage sums the prompts."""
    prompts = [[28120, 905], [1, 4093, 198]]
    body = call(fake, CMPL, {"prompt": prompts, "max_tokens": 3, "return_token_ids": True}).body
    assert [c["prompt_token_ids"] for c in body["choices"]] == prompts
    assert body["usage"]["prompt_tokens"] == 5


def test_prefill_echo_prepends_the_assistant_message(fake: FakeVLLM) -> None:
    """continue_final_message + echo: the prompt ends with the prefill, content starts with it."""
    messages = [*MESSAGES, {"role": "assistant", "content": "The weather"}]
    fields = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    body = _chat(fake, messages=messages, max_tokens=3, **fields)
    assert body["choices"][0]["message"]["content"].startswith("The weather")
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == len(
        body["prompt_token_ids"]
    )


# -- tools -----------------------------------------------------------------------------------------


def test_default_responder_calls_the_tool_and_vllm_parses_it(
    fake: FakeVLLM, tokenizer: Any
) -> None:
    """With tools, the raw Hermes markup is sampled and parsed into message.tool_calls."""
    choice = _chat(fake, tools=[WEATHER_TOOL])["choices"][0]
    message = choice["message"]
    assert message["content"] is None
    (tool_call,) = message["tool_calls"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", tool_call["id"])
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert choice["finish_reason"] == "tool_calls"
    raw = tokenizer.decode(choice["token_ids"][:-1])
    assert raw == hermes_tool_call("get_weather", {"city": "Paris"})


def test_tool_choice_variants_follow_vllm() -> None:
    """Named choice finishes "stop" with content ""; none leaves the markup as text."""
    fake = _fake("Checking. " + hermes_tool_call("get_weather", {"city": "Oslo"}))
    named = {"type": "function", "function": {"name": "get_weather"}}
    choice = _chat(fake, tools=[WEATHER_TOOL], tool_choice=named)["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", "Checking. ")
    auto = _chat(fake, tools=[WEATHER_TOOL])["choices"][0]
    assert auto["message"]["content"] == "Checking. " and auto["finish_reason"] == "tool_calls"
    none = _chat(fake, tools=[WEATHER_TOOL], tool_choice="none")["choices"][0]
    assert "tool_calls" not in none["message"] and "<tool_call>" in none["message"]["content"]


def test_streamed_tool_call_arrives_as_name_then_argument_fragments(fake: FakeVLLM) -> None:
    """Markup chunks have empty deltas; the name comes once, argument fragments concatenate."""
    body = _chat(fake, tools=[WEATHER_TOOL])
    chunks = _chat_stream(fake, tools=[WEATHER_TOOL])
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    names = [
        d["tool_calls"][0] for d in deltas if d.get("tool_calls") and "id" in d["tool_calls"][0]
    ]
    assert [n["function"]["name"] for n in names] == ["get_weather"]
    arguments = "".join(
        tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", [])
    )
    assert arguments == body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert deltas[0] == {} and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_default_responder_answers_after_a_tool_result(fake: FakeVLLM) -> None:
    """After a tool result the default model answers in text, using the result."""
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": hermes_tool_call("get_weather", {"city": "Paris"})},
        {"role": "tool", "tool_call_id": "x", "content": "sunny, 21 C"},
    ]
    choice = _chat(fake, messages=messages, tools=[WEATHER_TOOL])["choices"][0]
    assert "sunny, 21 C" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"


# -- scripting and drift ---------------------------------------------------------------------------


def test_drift_respells_tokens_without_changing_the_text(tokenizer: Any) -> None:
    """Drift mode: same text, valid but non-canonical ids, identical on every run."""
    text = "The quick brown fox jumps over the extraordinarily lazy dog near Copenhagen."
    canonical = _chat(_fake(text))["choices"][0]
    drifted = _chat(_fake(text, tokenization="drift", drift_rate=0.5))["choices"][0]
    again = _chat(_fake(text, tokenization="drift", drift_rate=0.5))["choices"][0]
    assert drifted["message"]["content"] == canonical["message"]["content"] == text
    assert (
        drifted["token_ids"] != canonical["token_ids"]
        and drifted["token_ids"] == again["token_ids"]
    )
    assert tokenizer.decode(drifted["token_ids"][:-1]) == text
    assert tokenizer.encode(text, add_special_tokens=False) == canonical["token_ids"][:-1]


def test_responder_may_script_exact_ids() -> None:
    """A responder returning ids makes the fake sample exactly those (EOS appended once)."""
    choice = _chat(_fake([9690, 198, 2683]))["choices"][0]
    assert choice["token_ids"] == [9690, 198, 2683, EOS_ID]
    assert _chat(_fake([9690, EOS_ID]))["choices"][0]["token_ids"] == [9690, EOS_ID]


def test_text_keeps_partial_utf8_out_and_non_ascii_raw() -> None:
    """Non-ASCII is emitted raw (UTF-8 bytes, not \\u escapes); a cut multi-byte char is dropped."""
    fake = _fake("Grüße 😀!")
    result = call(fake, CHAT, {"messages": MESSAGES})
    assert "Grüße 😀!".encode() in result.raw
    ids = _chat(fake)["choices"][0]["token_ids"]
    emoji_tokens = [i for i in range(1, len(ids)) if "😀" in FakeVLLM().codec.decode(ids[:i])]
    partial = _chat(fake, max_tokens=emoji_tokens[0] - 1)["choices"][0]["message"]["content"]
    assert partial == "Grüße"  # " " shares a token with the emoji's first bytes: dropped with them


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "status", "param", "message"),
    [
        ({"model": "nope"}, 404, "model", "The model `nope` does not exist"),
        ({"top_logprobs": 3}, 400, "top_logprobs", "`logprobs` must be set to true"),
        ({"logprobs": True, "top_logprobs": 30}, 400, "logprobs", "greater than max allowed: 20"),
        ({"max_tokens": 9000}, 400, "max_tokens", "cannot be greater than max_model_len=8192"),
        ({"max_tokens": 0}, 400, "max_tokens", "max_tokens must be at least 1, got 0."),
        ({"n": 2, "temperature": 0}, 400, None, "n must be 1 when using greedy sampling"),
        ({"n": "x"}, 400, "body.n", "'type': 'int_parsing', 'loc': 'body.n'"),
        ({"messages": None}, 400, "body.messages", "'type': 'missing'"),
        ({"messages": []}, 400, None, "Cannot apply chat template to an empty conversation"),
        ({"tool_choice": "required"}, 400, "tool_choice", "`tools` must be set"),
        ({"stream_options": {"include_usage": True}}, 400, "stream_options", "stream=True"),
        (
            {"messages": [{"role": "user", "content": "hi " * 9000}]},
            400,
            "input_tokens",
            "maximum context length is 8192 tokens",
        ),
    ],
)
def test_errors_use_vllms_nested_body(
    fake: FakeVLLM, fields: Any, status: int, param: str | None, message: str
) -> None:
    """Validation failures answer with vLLM's {"error": {message, type, param, code}}."""
    body = {k: v for k, v in {"messages": MESSAGES, **fields}.items() if v is not None}
    result = call(fake, CHAT, body)
    assert result.status == status
    assert list(result.body["error"]) == ["message", "type", "param", "code"]
    assert (result.body["error"]["param"], result.body["error"]["code"]) == (param, status)
    assert message in result.body["error"]["message"]


def test_max_tokens_beyond_the_window_is_cut_not_rejected() -> None:
    """max_tokens larger than what the context window leaves ends in "length" at the window."""
    fake = FakeVLLM(FakeConfig(max_model_len=40, responder=lambda view: "word " * 100))
    body = _chat(fake, max_tokens=35)
    assert body["usage"]["total_tokens"] == 40
    assert body["choices"][0]["finish_reason"] == "length"


def test_unknown_fields_are_ignored_and_unknown_routes_404(fake: FakeVLLM) -> None:
    """Unknown request fields change nothing; unknown paths and methods answer like FastAPI."""
    assert call(fake, CHAT, {"messages": MESSAGES, "no_such_field": 1}).status == 200
    assert call(fake, "/v1/nothing", {}).status == 404
    assert call(fake, "/v1/models", {}).status == 405
    assert call(fake, CHAT, None).status == 400
    models = call(fake, "/v1/models", method="GET").body
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
    assert models["data"][0]["max_model_len"] == 8192


def test_tokenize_and_detokenize(fake: FakeVLLM) -> None:
    """/tokenize returns ids and raw vocabulary strings; /detokenize keeps special tokens."""
    tokenized = call(fake, "/tokenize", {"prompt": "hello world", "return_token_strs": True}).body
    assert tokenized == {
        "count": 2,
        "max_model_len": 8192,
        "tokens": [28120, 905],
        "token_strs": ["hello", "Ġworld"],
    }
    assert call(fake, "/detokenize", {"tokens": [28120, 905, 2]}).body == {
        "prompt": "hello world<|im_end|>"
    }


def test_response_ids_look_like_vllms(fake: FakeVLLM) -> None:
    """Response ids are chatcmpl-/cmpl- plus 16 hex characters."""
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", _chat(fake, max_tokens=1)["id"])
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", call(fake, CMPL, {"prompt": "a"}).body["id"])
