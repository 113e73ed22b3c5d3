"""Divergence classification on real SmolLM2 ChatML token sequences (the project's tokenizer).

Prompts are rendered and encoded the way vLLM does server-side (chat template, then encode); sampled
ids are what a model could have produced, including non-canonical splits. `decode` is the tokenizer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tests.support.toy_chatml import toy_call
from tito_agents.assembly import AssemblyOptions, Divergence, EpisodeContext, assemble_merged
from tito_agents.assembly.divergence import DivergenceKind
from tito_agents.calls import Call
from tito_agents.samples import Sample

K = DivergenceKind
EOS = 2  # <|im_end|>
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _load() -> Any:
    """The real SmolLM2 tokenizer (the test environment always has it: no skip)."""
    from tito_agents.testing.smollm2 import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def tok() -> Any:
    return _load()


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def render(tok: Any, messages: list[dict[str, Any]], tools: Any = None) -> list[int]:
    """The prompt ids vLLM would build: chat template with generation prompt, then encode."""
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return enc(tok, text)


def merge(
    tok: Any, calls: list[Call], *, text: bool = True
) -> tuple[list[Sample], list[Divergence]]:
    def decode(ids: Sequence[int]) -> str:
        return str(tok.decode(list(ids)))

    options = AssemblyOptions.of(
        decode=decode if text else None, special_ids=tok.all_special_ids, eos_ids=[EOS]
    )
    return assemble_merged(calls, EpisodeContext("ep", 1.0), options)


USER = {"role": "user", "content": "Name a dataset of handwritten digits."}
FOLLOW_UP = {"role": "user", "content": "How many images does it have?"}


def two_turns(
    tok: Any, sampled: list[int], answer: dict[str, Any], *, finish: str = "stop", tools: Any = None
) -> list[Call]:
    """Turn 0 samples `sampled`; turn 1 re-renders the parsed `answer` message, then a user turn."""
    prompt0 = render(tok, [USER], tools)
    prompt1 = render(tok, [USER, answer, FOLLOW_UP], tools)
    return [
        toy_call("r0/0", prompt0, sampled, seq=0, finish=finish),
        toy_call("r1/0", prompt1, [*enc(tok, "It has 70,000 images."), EOS], seq=1),
    ]


def test_canonical_rerender_merges(tok: Any) -> None:
    """Sampled ids that re-encode canonically are an exact prefix: one merged sample."""
    answer = "The MNIST dataset."
    calls = two_turns(tok, [*enc(tok, answer), EOS], {"role": "assistant", "content": answer})
    samples, divergences = merge(tok, calls)
    assert divergences == [] and len(samples) == 1
    assert samples[0].num_trained == sum(c.num_sampled for c in calls)


def test_non_canonical_split_is_retokenized(tok: Any) -> None:
    """` data`+`set` sampled, ` dataset` re-encoded: same text, other ids -> RETOKENIZED."""
    answer = "The dataset is MNIST."
    sampled = [*enc(tok, "The"), *enc(tok, " data"), *enc(tok, "set"), *enc(tok, " is MNIST."), EOS]
    assert tok.decode(sampled) == answer + "<|im_end|>"
    assert sampled != [*enc(tok, answer), EOS]
    calls = two_turns(tok, sampled, {"role": "assistant", "content": answer})
    samples, divergences = merge(tok, calls)
    (d,) = divergences
    assert d.kind is K.RETOKENIZED
    assert d.rewrite_point == len(calls[0].prompt_ids) + len(enc(tok, "The"))
    assert "old: ' dataset is MNIST.<|im_end|>'" in d.excerpt
    assert "new: ' dataset is MNIST.<|im_end|>\\n" in d.excerpt
    # The first sample trains exactly what the engine sampled; the second only its own ids.
    assert np.array_equal(samples[0].token_ids, calls[0].token_ids)
    assert samples[1].num_trained == calls[1].num_sampled
    # Without decode, ids cannot tell a retokenization from an edit.
    assert [x.kind for x in merge(tok, calls, text=False)[1]] == [K.OTHER]


def test_tool_call_json_reserialized_is_template_rerender(tok: Any) -> None:
    """The model wrote compact JSON; the template re-serializes the parsed call with spaces."""
    sampled_text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    )
    parsed = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    calls = two_turns(tok, [*enc(tok, sampled_text), EOS], parsed, tools=TOOLS)
    (d,) = merge(tok, calls)[1]
    assert d.kind is K.TEMPLATE_RERENDER
    assert """old: '":"Paris"}}""" in d.excerpt and """new: '": "Paris"}}""" in d.excerpt


def test_dropped_reasoning_block_is_template_rerender(tok: Any) -> None:
    """A `<think>` block the framework drops from the history -> TEMPLATE_RERENDER (with text)."""
    sampled = [*enc(tok, "<think>\nDigits: MNIST.\n</think>\n\nThe MNIST dataset."), EOS]
    calls = two_turns(tok, sampled, {"role": "assistant", "content": "The MNIST dataset."})
    (d,) = merge(tok, calls)[1]
    assert d.kind is K.TEMPLATE_RERENDER
    assert d.rewrite_point == len(calls[0].prompt_ids)
    # `<think>` is plain text for SmolLM2 (no special id): ids alone cannot see a template change.
    assert [x.kind for x in merge(tok, calls, text=False)[1]] == [K.OTHER]


def test_changed_template_glue_is_template_rerender(tok: Any) -> None:
    """The re-render separates turns with a blank line: only template whitespace differs."""
    answer = "The MNIST dataset."
    calls = two_turns(tok, [*enc(tok, answer), EOS], {"role": "assistant", "content": answer})
    text = tok.decode(list(calls[1].prompt_ids)).replace("<|im_end|>\n", "<|im_end|>\n\n")
    calls[1].prompt_ids = np.array(enc(tok, text), dtype=np.int32)
    (d,) = merge(tok, calls)[1]
    assert d.kind is K.TEMPLATE_RERENDER
    assert [x.kind for x in merge(tok, calls, text=False)[1]] == [K.HISTORY_REWRITE]


def test_removed_turn_is_history_rewrite(tok: Any) -> None:
    """Memory trimming drops the first exchange from the history -> HISTORY_REWRITE."""
    a0, a1 = "The MNIST dataset.", "70,000 images."
    m0 = [USER]
    m1 = [USER, {"role": "assistant", "content": a0}, FOLLOW_UP]
    m2 = [*m1[1:], {"role": "assistant", "content": a1}, {"role": "user", "content": "Thanks!"}]
    calls = [
        toy_call("r0/0", render(tok, m0), [*enc(tok, a0), EOS], seq=0),
        toy_call("r1/0", render(tok, m1), [*enc(tok, a1), EOS], seq=1),
        toy_call("r2/0", render(tok, m2), [*enc(tok, "You are welcome."), EOS], seq=2),
    ]
    samples, divergences = merge(tok, calls)
    (d,) = divergences
    assert (d.kind, d.call_id, d.prev_call_id) == (K.HISTORY_REWRITE, "r2/0", "r1/0")
    assert d.rewrite_point == 1  # after `<|im_start|>`: `user` became `assistant`
    assert [s.call_ids for s in samples] == [["r0/0", "r1/0"], ["r2/0"]]
    assert [x.kind for x in merge(tok, calls, text=False)[1]] == [K.HISTORY_REWRITE]


def test_system_prompt_added_is_history_rewrite(tok: Any) -> None:
    """Tools added mid-episode put a system turn first: the whole history moved."""
    answer = "The MNIST dataset."
    calls = two_turns(tok, [*enc(tok, answer), EOS], {"role": "assistant", "content": answer})
    calls[1].prompt_ids = np.array(
        render(tok, [USER, {"role": "assistant", "content": answer}, FOLLOW_UP], TOOLS),
        dtype=np.int32,
    )
    (d,) = merge(tok, calls)[1]
    assert (d.kind, d.rewrite_point) == (K.HISTORY_REWRITE, 1)


def test_cut_inside_a_character_is_truncation(tok: Any) -> None:
    """`length` stops after the first byte token of an emoji; the text re-renders as U+FFFD."""
    emoji = enc(tok, "🙂")
    assert len(emoji) > 1
    sampled = [*enc(tok, "Hi"), emoji[0]]
    shown = tok.decode(sampled)
    assert shown.endswith("\ufffd")
    calls = two_turns(tok, sampled, {"role": "assistant", "content": shown}, finish="length")
    (d,) = merge(tok, calls)[1]
    assert d.kind is K.TRUNCATION
    assert d.rewrite_point == len(calls[0].prompt_ids) + len(enc(tok, "Hi"))
    assert [x.kind for x in merge(tok, calls, text=False)[1]] == [K.TRUNCATION]


def test_truncated_on_token_boundary_merges(tok: Any) -> None:
    """A `length` cut on a clean token boundary re-renders as an exact prefix: no divergence."""
    sampled = enc(tok, "The MNIST data")
    shown = tok.decode(sampled)
    calls = two_turns(tok, sampled, {"role": "assistant", "content": shown}, finish="length")
    samples, divergences = merge(tok, calls)
    assert divergences == [] and samples[0].spans[0].finish_reason == "length"


def test_resample_of_same_prompt_keeps_both(tok: Any) -> None:
    """Two choices of one request: sibling samples, both trained, neither dropped."""
    prompt = np.array(render(tok, [USER]), dtype=np.int32)
    a = toy_call("r0/0", prompt, [*enc(tok, "MNIST."), EOS], seq=0)
    b = toy_call("r0/1", prompt, [*enc(tok, "EMNIST."), EOS], seq=0, choice=1)
    samples, divergences = merge(tok, [a, b])
    (d,) = divergences
    assert (d.kind, d.rewrite_point) == (K.RESAMPLE, prompt.shape[0])
    assert "old: 'MNIST.<|im_end|>' | new: 'EMNIST.<|im_end|>'" in d.excerpt
    assert [s.num_trained for s in samples] == [a.num_sampled, b.num_sampled]
