"""Building blocks of the fake: byte-exact decoding, drift, the hermes parser, the logprob model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tito_agents.testing import FakeVLLM, hermes_tool_call
from tito_agents.testing.fake_vllm._codec import TokenCodec
from tito_agents.testing.fake_vllm._logprobs import LogprobModel
from tito_agents.testing.fake_vllm._tools import HermesStream, parse_tool_calls

SAMPLES = [
    "hello world",
    "Grüße, 😀 日本語!",
    "  spaced\n\ttabs",
    "<tool_call>\n{}",
    "a<|im_end|>b",
]


@pytest.fixture(scope="module")
def codec(fake: FakeVLLM) -> TokenCodec:
    return fake.codec


def test_token_bytes_reproduce_the_tokenizers_decode(codec: TokenCodec, tokenizer: Any) -> None:
    """Per-token bytes and texts agree with transformers' decode, for every 7th vocabulary id."""
    for token_id in range(0, codec.vocab_size, 7):
        assert codec.token_text(token_id) == tokenizer.decode([token_id]), token_id
    for text in SAMPLES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert codec.encode(text, add_special_tokens=False) == ids
        assert codec.decode(ids) == tokenizer.decode(ids) == text


def test_incremental_decoding_holds_partial_characters(codec: TokenCodec) -> None:
    """A character split over tokens appears once complete; skipped specials add nothing."""
    ids = codec.encode("😀!", add_special_tokens=False)
    assert len(ids) > 2  # the emoji's four bytes span several byte tokens
    decoder = codec.text_decoder(skip_special_tokens=True)
    pieces = [decoder.push(token_id) for token_id in [*ids, 2]]
    assert "".join(pieces) == "😀!"
    assert pieces[0] == "" and pieces[-1] == ""
    spaced = codec.text_decoder(skip_special_tokens=True)
    assert [spaced.push(t) for t in [26843, 40303, 218]] == ["Hi", "", " 😀"]  # "Hi 😀"
    keep = codec.text_decoder(skip_special_tokens=False)
    assert "".join(keep.push(t) for t in [*ids, 2]) == "😀!<|im_end|>"


def test_logprob_texts_decode_in_context(codec: TokenCodec) -> None:
    """Logprob strings: a token ending inside a character shows "", the completing one shows all.

    The ids and strings are those a real vLLM 0.32 returned for "Emoji 😀😀".
    """
    ids = [10809, 33777, 40303, 218, 10813, 242, 218]
    rows = [(token_id, [token_id, 29]) for token_id in ids]
    texts = codec.logprob_texts([], rows)
    assert [row[t] for row, t in zip(texts, ids, strict=True)] == [
        "Em",
        "oji",
        "",
        " 😀",
        "",
        "",
        "😀",
    ]
    assert texts[2][29] == "-"  # an alternative is decoded in the same context
    assert codec.token_text(40303) == " \ufffd"  # decoded alone it ends in a broken character


def test_drift_keeps_bytes_and_changes_ids(codec: TokenCodec) -> None:
    """Drift re-spells tokens into shorter valid ones: same bytes, other ids, deterministic."""
    ids = codec.encode(
        "Internationalization is extraordinarily complicated", add_special_tokens=False
    )
    drifted = codec.drift(ids, rate=1.0, key=1)
    assert drifted != ids and len(drifted) > len(ids)
    assert codec.decode(drifted) == codec.decode(ids)
    assert codec.encode(codec.decode(drifted), add_special_tokens=False) == ids
    assert codec.drift(ids, rate=1.0, key=1) == drifted
    assert codec.drift(ids, rate=0.0, key=1) == ids


def test_hermes_parse_extracts_calls_and_leading_content() -> None:
    """Calls become (name, JSON arguments); text before the first call is content; junk is text."""
    text = "Let me check.\n" + hermes_tool_call("f", {"x": 1}) + hermes_tool_call("g", {"y": "é"})
    parsed = parse_tool_calls(text)
    assert parsed.calls == (("f", '{"x": 1}'), ("g", '{"y": "é"}'))
    assert parsed.content == "Let me check.\n"
    assert parse_tool_calls(hermes_tool_call("f", {})).content is None
    broken = '<tool_call>\n{"name": "f", "arguments": 99'
    assert parse_tool_calls(broken).calls == () and parse_tool_calls(broken).content == broken


def test_hermes_stream_holds_partial_tags_and_diffs_arguments() -> None:
    """Streaming: content stops before a possible tag, the name comes whole, arguments grow."""
    text = "Sure. " + hermes_tool_call("get_weather", {"city": "Paris", "days": 2})
    parser = HermesStream()
    content, names, arguments = "", [], ""
    for end in range(1, len(text) + 1):
        fed = parser.feed(text[:end], finished=end == len(text))
        if text[:end].endswith("Sure. <tool"):
            assert fed is None
        if fed is None:
            continue
        content += fed[0] or ""
        for delta in fed[1]:
            names += [delta.name] if delta.name else []
            arguments += delta.arguments or ""
    assert content == "Sure. " and names == ["get_weather"]
    assert json.loads(arguments) == {"city": "Paris", "days": 2}
    assert arguments == '{"city": "Paris", "days": 2}'


def test_logprobs_are_a_function_of_the_context(fake: FakeVLLM) -> None:
    """The same ids after the same context always get the same logprob, in (-10, 0]."""
    model = LogprobModel(fake.codec.vocab_size, fake.codec.special_ids)
    steps = model.sampled([1, 2, 3], [10, 11, 12], top_k=5)
    assert steps == model.sampled([1, 2, 3], [10, 11, 12], top_k=5)
    assert all(-10 < s.logprob <= 0 and s.ranked[0] == (s.token_id, s.logprob) for s in steps)
    assert all(len(s.ranked) == 6 for s in steps)
    prompt = model.prompt([1, 2, 3, 10, 11, 12], top_k=0)
    assert [p.logprob for p in prompt[3:] if p] == [s.logprob for s in steps]
    assert model.sampled([9, 2, 3], [10], top_k=0)[0].logprob != steps[0].logprob
