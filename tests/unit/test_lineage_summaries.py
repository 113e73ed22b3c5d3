"""Which calls are summaries, on literal `Call` records of the toy ChatML model: a summariser
labelled in either spelling, and an unlabelled one whose summary the next prompt quotes inside
another message, with words around it, re-tokenized at its edges (or, given a decoder, anywhere).
A summary replayed as a whole assistant turn is a kept answer, not a quote."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.support.toy_chatml import (
    ASSISTANT,
    EOS_IDS,
    HEADER,
    IM_END,
    NL,
    SPECIAL_IDS,
    SYSTEM,
    USER,
    decode,
    letter,
    marker,
    message,
    pair,
    toy_call,
)
from tito_agents.assembly import AssemblyOptions, EpisodeContext, assemble_merged
from tito_agents.assembly.per_call import assemble_per_call
from tito_agents.calls import Call
from tito_agents.samples import SUMMARIZER_ROLE, Sample

BARE = AssemblyOptions.of("merged")
"""What a `Collector` without a tokenizer assembles with: no decode, no end-of-turn ids."""
TOKENIZER = AssemblyOptions.of("merged", decode=decode, special_ids=SPECIAL_IDS, eos_ids=EOS_IDS)
PREFIX = marker(50)
"""The words before a quoted summary ("Summary so far:")."""
SUMMARY = [pair("th"), *(letter(c) for c in "abc"), pair("de"), *(letter(c) for c in "fghix")]
"""The summariser's sampled text, "thabcdefghix", before its end-of-turn id."""
SAME_EDGES_RETOKENIZED = [letter("t"), letter("h"), *SUMMARY[1:-1], pair("xy")]
"""SUMMARY quoted after a prefix and before more words: "th" and "x" are tokenized differently
("thabcdefghixy")."""
MIDDLE_RETOKENIZED = [*SUMMARY[:4], letter("d"), letter("e"), *SUMMARY[5:]]
"""SUMMARY with "de" sampled as one id and quoted as two: no eight ids of it appear in a row."""


def episode(quote: Sequence[int], *, role: str | None = None) -> list[Call]:
    """A turn, a summariser's own request (labelled `role`), then a turn on [system, `quote`]."""
    system = message(SYSTEM, marker(1))
    first = [*system, *message(USER, marker(2)), *HEADER]
    summarise = [*message(SYSTEM, marker(4)), *message(USER, marker(3), letter("a")), *HEADER]
    after = [*system, *quote, *message(USER, marker(5)), *HEADER]
    labels = {"role": role} if role else None
    return [
        toy_call("c0", first, [marker(3), letter("a"), IM_END], seq=0, agent="solver"),
        toy_call("c1", summarise, [*SUMMARY, IM_END], seq=1, agent="solver", labels=labels),
        toy_call("c2", after, [marker(6), IM_END], seq=2, agent="solver"),
    ]


def merged(calls: list[Call], options: AssemblyOptions) -> list[Sample]:
    samples, divergences = assemble_merged(calls, EpisodeContext("ep", episode_reward=1.0), options)
    assert [s.call_ids for s in samples] == [["c0"], ["c1"], ["c2"]]
    assert [d.rewrite for d in divergences] == [s.rewrite for s in samples[1:]]
    return samples


def assert_summary_recognised(samples: list[Sample]) -> None:
    turn, summariser, after = samples
    assert summariser.is_summary and summariser.spans[0].role == SUMMARIZER_ROLE
    assert summariser.rewrite is None  # its own request rewrites nothing
    assert after.rewrite == "summary" and after.prev_sample_id == summariser.sample_id
    assert not turn.is_summary and not after.is_summary


@pytest.mark.parametrize("role", ["summariser", "summarizer", "Summariser"])
def test_a_labelled_summariser_in_either_spelling_is_a_summary(role: str) -> None:
    """Labelled, the summary may go anywhere, in any form: here as a whole assistant turn."""
    quote = message(ASSISTANT, *SAME_EDGES_RETOKENIZED)
    assert_summary_recognised(merged(episode(quote, role=role), BARE))


@pytest.mark.parametrize("role", ["summariser", "summarizer"])
def test_per_call_samples_of_a_labelled_summariser_are_summaries(role: str) -> None:
    samples = assemble_per_call(episode(message(USER, *SUMMARY), role=role), EpisodeContext("ep"))
    assert [s.is_summary for s in samples] == [False, True, False]
    assert samples[1].spans[0].role == SUMMARIZER_ROLE


@pytest.mark.parametrize("role", [ASSISTANT, USER, SYSTEM])
@pytest.mark.parametrize("options", [BARE, TOKENIZER], ids=["bare", "tokenizer"])
def test_an_unlabelled_summary_quoted_with_its_edges_retokenized_is_recognised(
    role: int, options: AssemblyOptions
) -> None:
    """ "Summary so far: <summary>" then more words, in any role: the sampled ids are not in the
    prompt verbatim (neither its first nor its last id, nor the end-of-turn id)."""
    quote = message(role, PREFIX, *SAME_EDGES_RETOKENIZED, letter("z"))
    assert_summary_recognised(merged(episode(quote), options))


def test_an_unlabelled_summary_retokenized_inside_is_recognised_by_its_text() -> None:
    quote = message(ASSISTANT, PREFIX, *MIDDLE_RETOKENIZED)
    assert_summary_recognised(merged(episode(quote), TOKENIZER))
    without_decode = merged(episode(quote), BARE)  # its ids alone are no evidence
    assert not any(s.is_summary for s in without_decode)
    assert without_decode[2].rewrite != "summary"


@pytest.mark.parametrize(
    ("content", "options"),
    [
        (SUMMARY[:-1] + [pair("xy")], BARE),
        (SUMMARY[:-1] + [pair("xy")], TOKENIZER),
        (MIDDLE_RETOKENIZED, TOKENIZER),
    ],
    ids=["edge-ids", "edge-tokenizer", "middle-text"],
)
def test_an_unlabelled_answer_replayed_as_an_assistant_turn_is_no_summary(
    content: list[int], options: AssemblyOptions
) -> None:
    """Right after the assistant turn's opening, the same ids (or text) are an answer the history
    kept, however its edges were re-tokenized."""
    samples = merged(episode(message(ASSISTANT, *content)), options)
    assert not any(s.is_summary for s in samples)
    assert samples[2].rewrite != "summary"


def test_a_short_completion_is_never_taken_for_a_summary_by_its_ids() -> None:
    short = [letter("q"), letter("r"), letter("s")]
    calls = episode(message(USER, PREFIX, *short))
    calls[1] = toy_call("c1", calls[1].prompt_ids, [*short, IM_END], seq=1, agent="solver")
    samples = merged(calls, TOKENIZER)
    assert not any(s.is_summary for s in samples)


@pytest.mark.parametrize("options", [BARE, TOKENIZER], ids=["bare", "tokenizer"])
def test_a_summary_the_history_kept_is_not_taken_again(options: AssemblyOptions) -> None:
    """After the rewrite that used a summary, an edit of the message that quotes it is an edit:
    the summary was already in the prompt the agent continued."""
    quote = [PREFIX, *SAME_EDGES_RETOKENIZED, letter("z")]
    calls = episode(message(USER, *quote))
    edited = [*message(SYSTEM, marker(1)), *message(USER, marker(51), *quote[1:])]
    tail = [*HEADER, marker(6), IM_END, NL, *message(USER, marker(7)), *HEADER]
    calls.append(
        toy_call("c3", [*edited, *message(USER, marker(5)), *tail], [IM_END], seq=3, agent="solver")
    )
    samples, _ = assemble_merged(calls, EpisodeContext("ep"), options)
    assert [s.call_ids for s in samples] == [["c0"], ["c1"], ["c2"], ["c3"]]
    assert [s.rewrite for s in samples] == [None, None, "summary", "message_edited"]
    assert [s.is_summary for s in samples] == [False, True, False, False]
