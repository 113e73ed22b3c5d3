"""Merged assembly with literal episodes: extension, every divergence kind, branches, rewards, report."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from tests.support.toy_chatml import (
    END_THINK,
    EOS_IDS,
    HEADER,
    IM_END,
    IM_START,
    NL,
    SPECIAL_IDS,
    SYSTEM,
    THINK,
    TOOL,
    USER,
    decode,
    letter,
    marker,
    message,
    pair,
    toy_call,
)
from tito_agents import Collector, ConfigurationError
from tito_agents.assembly import (
    AssemblyMode,
    AssemblyOptions,
    Divergence,
    EpisodeContext,
    assemble,
    assemble_merged,
    assemble_per_call,
    assembly_report,
    merged_reward,
)
from tito_agents.assembly.divergence import (
    DivergenceKind,
    classify_rewrite,
    common_prefix_len,
    normalize_template_text,
)
from tito_agents.calls import Call, CallStatus
from tito_agents.samples import Sample


def merge(
    calls: Sequence[Call],
    *,
    text: bool = True,
    ids: bool = True,
    episode_reward: float | None = None,
    metadata: dict[str, object] | None = None,
    turn_discount: float = 1.0,
) -> tuple[list[Sample], list[Divergence]]:
    options = AssemblyOptions.of(
        AssemblyMode.MERGED,
        turn_discount=turn_discount,
        decode=decode if text else None,
        special_ids=SPECIAL_IDS if ids else None,
        eos_ids=EOS_IDS,
    )
    return assemble_merged(calls, EpisodeContext("ep", episode_reward, metadata=metadata), options)


SYS = message(SYSTEM, marker(0), letter("b"))
USER0 = message(USER, marker(1), pair("hi"))
PROMPT0 = SYS + USER0 + HEADER


def two_turns(rendered_answer: list[int], sampled: list[int], finish: str = "stop") -> list[Call]:
    """Turn 0 samples `sampled`; turn 1's prompt renders it as `rendered_answer`, then a tool turn."""
    first = toy_call("r0/0", PROMPT0, sampled, seq=0, finish=finish)
    prompt1 = PROMPT0 + rendered_answer + message(TOOL, marker(2), letter("x")) + HEADER
    second = toy_call("r1/0", prompt1, [marker(3), pair("ok"), IM_END], seq=1)
    return [first, second]


def kinds(divergences: list[Divergence]) -> list[DivergenceKind]:
    return [d.kind for d in divergences]


# ---- exact extension ----


def test_exact_extension_merges_into_one_sample() -> None:
    """Prompts that start with the previous prompt + sampled ids make one sample, loss 0 on deltas."""
    answer = [marker(5), pair("da"), pair("ta"), IM_END]
    calls = two_turns([*answer, NL], answer)
    samples, divergences = merge(calls, episode_reward=1.0)
    assert divergences == []
    (sample,) = samples
    sample.validate()
    second = calls[1]
    assert np.array_equal(sample.token_ids, second.token_ids)
    first_span, second_span = sample.spans
    assert (first_span.context_start, first_span.start, first_span.end) == (
        0,
        len(PROMPT0),
        len(PROMPT0) + 4,
    )
    assert second_span.context_start == first_span.end
    assert second_span.start == len(second.prompt_ids)
    expected_mask = np.zeros(sample.num_tokens, dtype=np.uint8)
    expected_mask[first_span.start : first_span.end] = 1
    expected_mask[second_span.start : second_span.end] = 1
    assert np.array_equal(sample.loss_mask, expected_mask)
    assert sample.logprobs is not None
    assert calls[0].logprobs is not None and calls[1].logprobs is not None
    assert np.array_equal(sample.logprobs[first_span.start : first_span.end], calls[0].logprobs)
    assert np.array_equal(sample.logprobs[second_span.start :], calls[1].logprobs)
    assert not sample.logprobs[expected_mask == 0].any()
    assert (sample.start_reason, sample.end_reason) == ("episode_start", "end")
    assert sample.call_ids == ["r0/0", "r1/0"]
    assert sample.reward == 1.0


def test_template_suffix_newline_is_context() -> None:
    """The model stops at <|im_end|>; the re-rendered `\\n` after it is loss-0 context, not a break."""
    answer = [marker(5), pair("ok"), IM_END]
    samples, divergences = merge(two_turns([*answer, NL], answer))
    assert divergences == [] and len(samples) == 1
    start = samples[0].spans[0].end
    assert samples[0].token_ids[start] == NL and samples[0].loss_mask[start] == 0


def test_truncated_completion_extended_exactly_still_merges() -> None:
    """A `length` completion the template closes with <|im_end|> is an exact prefix: no break."""
    cut = [marker(5), pair("da"), letter("t")]
    samples, divergences = merge(two_turns([*cut, IM_END, NL], cut, finish="length"))
    assert divergences == [] and len(samples) == 1
    assert samples[0].spans[0].finish_reason == "length"


# ---- each divergence kind ----


def test_retokenized_tail() -> None:
    """Sampled `d`,`a`,`ta` re-rendered as `da`,`ta`: same text, other ids -> RETOKENIZED."""
    sampled = [marker(5), letter("d"), letter("a"), pair("ta"), IM_END]
    rendered = [marker(5), pair("da"), pair("ta"), IM_END, NL]
    calls = two_turns(rendered, sampled)
    samples, divergences = merge(calls)
    (d,) = divergences
    assert d.kind is DivergenceKind.RETOKENIZED
    assert d.rewrite_point == len(PROMPT0) + 1
    assert (d.call_id, d.prev_call_id) == ("r1/0", "r0/0")
    assert [(s.start_reason, s.end_reason) for s in samples] == [
        ("episode_start", "retokenized"),
        ("retokenized", "end"),
    ]
    assert (d.prev_sample_id, d.sample_id) == (samples[0].sample_id, samples[1].sample_id)
    # Nothing lost: the first sample trains the ids the engine sampled, the second only its own.
    assert np.array_equal(samples[0].token_ids, calls[0].token_ids)
    assert samples[1].num_trained == calls[1].num_sampled
    assert np.array_equal(samples[1].token_ids[: len(calls[1].prompt_ids)], calls[1].prompt_ids)
    assert "old: 'data<|im_end|>'" in d.excerpt and "new: 'data<|im_end|>" in d.excerpt
    # Ids alone cannot tell retokenization from an edit of the last completion.
    assert kinds(merge(calls, text=False)[1]) == [DivergenceKind.OTHER]


def test_dropped_reasoning_block_is_template_rerender() -> None:
    """A `<think>…</think>` block the template drops from history -> TEMPLATE_RERENDER."""
    sampled = [THINK, pair("hm"), END_THINK, marker(5), pair("ok"), IM_END]
    calls = two_turns([marker(5), pair("ok"), IM_END, NL], sampled)
    (d,) = merge(calls)[1]
    assert d.kind is DivergenceKind.TEMPLATE_RERENDER
    assert d.rewrite_point == len(PROMPT0)
    assert kinds(merge(calls, text=False)[1]) == [DivergenceKind.TEMPLATE_RERENDER]
    assert kinds(merge(calls, ids=False)[1]) == [DivergenceKind.TEMPLATE_RERENDER]
    assert kinds(merge(calls, text=False, ids=False)[1]) == [DivergenceKind.OTHER]


def test_changed_glue_is_template_rerender_with_text() -> None:
    """Whitespace glue re-rendered differently in an earlier turn: template with text, else history."""
    answer = [marker(5), pair("ok"), IM_END]
    first = toy_call("r0/0", PROMPT0, answer, seq=0)
    glued_user = [IM_START, USER, NL, NL, marker(1), pair("hi"), IM_END, NL]
    prompt1 = SYS + glued_user + HEADER + [*answer, NL] + message(TOOL, marker(2)) + HEADER
    second = toy_call("r1/0", prompt1, [marker(3), IM_END], seq=1)
    assert kinds(merge([first, second])[1]) == [DivergenceKind.TEMPLATE_RERENDER]
    assert kinds(merge([first, second], text=False)[1]) == [DivergenceKind.HISTORY_REWRITE]


def test_removed_message_is_history_rewrite() -> None:
    """An earlier message dropped from the history -> HISTORY_REWRITE at its position."""
    a0 = [marker(5), pair("ok"), IM_END]
    first = toy_call("r0/0", PROMPT0, a0, seq=0)
    obs1 = message(TOOL, marker(2), letter("x"))
    prompt1 = PROMPT0 + [*a0, NL] + obs1 + HEADER
    a1 = [marker(6), IM_END]
    second = toy_call("r1/0", prompt1, a1, seq=1)
    # Memory trimming: the first user turn is removed.
    prompt2 = (
        SYS + HEADER + [*a0, NL] + obs1 + HEADER + [*a1, NL] + message(USER, marker(7)) + HEADER
    )
    third = toy_call("r2/0", prompt2, [marker(8), IM_END], seq=2)
    samples, divergences = merge([first, second, third])
    (d,) = divergences
    assert d.kind is DivergenceKind.HISTORY_REWRITE
    assert d.rewrite_point == len(SYS) + 1  # after the shared <|im_start|>
    assert (d.call_id, d.prev_call_id) == ("r2/0", "r1/0")
    assert [s.call_ids for s in samples] == [["r0/0", "r1/0"], ["r2/0"]]
    assert kinds(merge([first, second, third], text=False)[1]) == [DivergenceKind.HISTORY_REWRITE]


def test_truncation() -> None:
    """A `length` completion without <|im_end|> whose last token the re-render changes -> TRUNCATION."""
    cut = [marker(5), pair("da"), letter("t")]
    calls = two_turns([marker(5), pair("da"), IM_END, NL], cut, finish="length")
    (d,) = merge(calls)[1]
    assert d.kind is DivergenceKind.TRUNCATION
    assert d.rewrite_point == len(PROMPT0) + 2
    assert kinds(merge(calls, text=False, ids=False)[1]) == [DivergenceKind.TRUNCATION]


def test_length_that_ended_on_eos_is_not_truncation() -> None:
    """With `eos_ids`, a completion ending on an end-of-turn id is not called a truncation."""
    old = np.array([5, 6, IM_END], dtype=np.int32)
    kind = classify_rewrite(
        old[1:],
        np.array([7, IM_END], dtype=np.int32),
        rewrite_point=11,
        last_start=10,
        last_end=13,
        last_finish_reason="length",
        last_sampled_ids=old,
        eos_ids=EOS_IDS,
    )
    assert kind is DivergenceKind.OTHER


def test_resample_n2_choices_are_siblings_both_kept() -> None:
    """`n=2` choices share a prompt: two sibling samples; the agent continues the second."""
    shared = np.array(PROMPT0, dtype=np.int32)
    c0 = toy_call("r0/0", shared, [marker(5), IM_END], seq=0, choice=0)
    c1 = toy_call("r0/1", shared, [marker(6), IM_END], seq=0, choice=1)
    prompt1 = PROMPT0 + [marker(6), IM_END, NL] + message(TOOL, marker(2)) + HEADER
    nxt = toy_call("r1/0", prompt1, [marker(7), IM_END], seq=1)
    samples, divergences = merge([nxt, c1, c0])  # order of the input does not matter
    (d,) = divergences
    assert d.kind is DivergenceKind.RESAMPLE
    assert (d.call_id, d.prev_call_id, d.rewrite_point) == ("r0/1", "r0/0", len(PROMPT0))
    assert [s.call_ids for s in samples] == [["r0/0"], ["r0/1", "r1/0"]]
    assert [(s.start_reason, s.end_reason) for s in samples] == [
        ("episode_start", "resample"),
        ("resample", "end"),
    ]
    assert "old: '#5;<|im_end|>' | new: '#6;<|im_end|>'" in d.excerpt


def test_retry_with_equal_prompt_is_resample() -> None:
    """A retry (new request, equal prompt ids in a new array) of an earlier turn -> RESAMPLE."""
    answer = [marker(5), pair("ok"), IM_END]
    first, second = two_turns([*answer, NL], answer)
    retry = toy_call("r2/0", list(second.prompt_ids), [marker(9), IM_END], seq=2)
    retry_first = toy_call("r3/0", PROMPT0, [marker(10), IM_END], seq=3)
    samples, divergences = merge([first, second, retry, retry_first])
    assert [(d.call_id, d.prev_call_id, d.kind) for d in divergences] == [
        ("r2/0", "r1/0", DivergenceKind.RESAMPLE),
        ("r3/0", "r0/0", DivergenceKind.RESAMPLE),
    ]
    assert [s.call_ids for s in samples] == [["r0/0", "r1/0"], ["r2/0"], ["r3/0"]]
    assert samples[0].end_reason == "resample"


def test_parallel_sub_calls_branch() -> None:
    """Two calls in flight at once from the same history branch; each branch keeps growing."""
    a0 = [marker(5), IM_END]
    first = toy_call("r0/0", PROMPT0, a0, seq=0)
    base = PROMPT0 + [*a0, NL]
    px = base + message(USER, marker(6)) + HEADER
    py = base + message(USER, marker(7)) + HEADER
    x = toy_call("r1/0", px, [marker(8), IM_END], seq=1, started=10.0, ended=13.0)
    y = toy_call("r2/0", py, [marker(9), IM_END], seq=2, started=11.0, ended=14.0)
    x2 = toy_call("r3/0", px + [marker(8), IM_END, NL] + HEADER, [marker(10), IM_END], seq=3)
    y2 = toy_call("r4/0", py + [marker(9), IM_END, NL] + HEADER, [marker(11), IM_END], seq=4)
    samples, divergences = merge([first, x, y, x2, y2])
    (d,) = divergences
    assert (d.call_id, d.prev_call_id, d.kind) == ("r2/0", "r1/0", DivergenceKind.BRANCH)
    assert d.rewrite_point == len(base) + 3
    assert [s.call_ids for s in samples] == [["r0/0", "r1/0", "r3/0"], ["r2/0", "r4/0"]]
    assert [(s.start_reason, s.end_reason) for s in samples] == [
        ("episode_start", "end"),
        ("branch", "end"),
    ]


def test_overlap_in_time_is_not_a_branch_when_the_prompt_saw_the_output() -> None:
    """A prompt holding part of the previous output was not a parallel call, whatever the clocks say."""
    sampled = [marker(5), letter("d"), letter("a"), IM_END]
    calls = two_turns([marker(5), pair("da"), IM_END, NL], sampled)
    calls[1].started_at = calls[0].ended_at - 0.001  # the stream closed just after the next send
    assert kinds(merge(calls)[1]) == [DivergenceKind.RETOKENIZED]


def test_backtrack_to_an_earlier_call_starts_a_new_sample() -> None:
    """A prompt extending an earlier call (not the latest tip) starts a sample from that history."""
    a0 = [marker(5), IM_END]
    first = toy_call("r0/0", PROMPT0, a0, seq=0)
    base = PROMPT0 + [*a0, NL]
    p1 = base + message(TOOL, marker(6)) + HEADER
    second = toy_call("r1/0", p1, [marker(7), IM_END], seq=1)
    p2 = base + message(TOOL, marker(8)) + HEADER  # the agent went back and tried another tool
    third = toy_call("r2/0", p2, [marker(9), IM_END], seq=2)
    samples, divergences = merge([first, second, third])
    (d,) = divergences
    assert d.kind is DivergenceKind.HISTORY_REWRITE and d.prev_call_id == "r1/0"
    assert d.rewrite_point == len(base) + 3
    assert samples[1].spans[0].context_start == 0
    assert samples[1].num_trained == 2


def test_longest_tip_wins_and_every_chain_stays_open() -> None:
    """A call may continue an older chain; when two tips fit, the longer (more specific) wins."""
    shared = np.array(PROMPT0, dtype=np.int32)
    short = toy_call("r0/0", shared, [marker(5)], seq=0, finish="length")
    long = toy_call("r0/1", shared, [marker(5), pair("ok"), IM_END], seq=0, choice=1)
    nxt = toy_call("r1/0", PROMPT0 + [marker(5), pair("ok"), IM_END, NL] + HEADER, [IM_END], seq=1)
    again = toy_call("r2/0", PROMPT0 + [marker(5), IM_END, NL] + HEADER, [IM_END], seq=2)
    samples, divergences = merge([short, long, nxt, again])
    assert kinds(divergences) == [DivergenceKind.RESAMPLE]
    # `nxt` fits both tips and takes the longer; `again` goes back to the short (truncated) one.
    assert [s.call_ids for s in samples] == [["r0/0", "r2/0"], ["r0/1", "r1/0"]]


def test_sibling_tie_goes_to_the_continued_sibling() -> None:
    """n=2 siblings share the rewrite point; the one whose ids the prompt reuses is the parent."""
    shared = np.array(PROMPT0, dtype=np.int32)
    thought = toy_call(
        "r0/0", shared, [THINK, pair("hm"), END_THINK, marker(5), pair("ok"), IM_END], seq=0
    )
    other = toy_call("r0/1", shared, [marker(6), pair("no"), IM_END], seq=0, choice=1)
    prompt1 = PROMPT0 + [marker(5), pair("ok"), IM_END, NL] + message(USER, marker(7)) + HEADER
    nxt = toy_call("r1/0", prompt1, [marker(8), IM_END], seq=1)
    _, divergences = merge([thought, other, nxt])
    assert [(d.call_id, d.prev_call_id, d.kind) for d in divergences] == [
        ("r0/1", "r0/0", DivergenceKind.RESAMPLE),
        ("r1/0", "r0/0", DivergenceKind.TEMPLATE_RERENDER),
    ]


# ---- grouping, filtering, provenance ----


def test_agents_are_separate_groups_and_none_is_one() -> None:
    """Calls of different agents never merge; the None agent is a group of its own."""
    a = toy_call("a/0", PROMPT0, [marker(5), IM_END], seq=0, agent="planner")
    b = toy_call("b/0", PROMPT0, [marker(6), IM_END], seq=1, agent=None)
    a2_prompt = PROMPT0 + [marker(5), IM_END, NL] + HEADER
    a2 = toy_call("c/0", a2_prompt, [IM_END], seq=2, agent="planner")
    b2 = toy_call("d/0", PROMPT0 + [marker(6), IM_END, NL] + HEADER, [IM_END], seq=3)
    samples, divergences = merge([b2, a2, b, a])
    assert divergences == []
    assert [(s.agent, s.call_ids) for s in samples] == [
        ("planner", ["a/0", "c/0"]),
        (None, ["b/0", "d/0"]),
    ]
    assert all(s.start_reason == "episode_start" for s in samples)


def test_incomplete_unusable_and_duplicate_calls_are_skipped() -> None:
    """Only complete calls become samples, and a re-delivered call id is used once."""
    answer = [marker(5), IM_END]
    first, second = two_turns([*answer, NL], answer)
    dup = toy_call("r0/0", PROMPT0, answer, seq=0)
    cut = toy_call("r9/0", [1, 2, 3], [4], seq=5, status=CallStatus.INCOMPLETE)
    bad = toy_call("r8/0", PROMPT0, [7], seq=6, status=CallStatus.UNUSABLE)
    samples, divergences = merge([first, dup, second, cut, bad])
    assert divergences == []
    assert [s.call_ids for s in samples] == [["r0/0", "r1/0"]]


def test_policy_version_labels_and_model_per_span() -> None:
    """Each span keeps its call's policy version and finish reason; labels go to metadata."""
    answer = [marker(5), IM_END]
    first, second = two_turns([*answer, NL], answer)
    first.policy_version, second.policy_version = "v1", "v2"
    first.labels = {"node": "plan"}
    (sample,), _ = merge([first, second], metadata={"run": "x"})
    assert [s.policy_version for s in sample.spans] == ["v1", "v2"]
    assert [s.finish_reason for s in sample.spans] == ["stop", "stop"]
    assert sample.metadata == {"run": "x", "call_labels": {"r0/0": {"node": "plan"}}}
    assert sample.model == "toy"


def test_logprobs_none_when_any_call_lacks_them() -> None:
    """A merged sample never invents logprobs: one call without them makes the sample's None."""
    answer = [marker(5), IM_END]
    first, second = two_turns([*answer, NL], answer)
    second.logprobs = None
    (sample,), _ = merge([first, second])
    assert sample.logprobs is None


# ---- rewards ----


def test_merged_reward_rule() -> None:
    """episode reward + sum of discounted call rewards; None when nothing is set."""
    assert merged_reward([None, None], None) is None
    assert merged_reward([None, None], 1.0) == 1.0
    assert merged_reward([0.5, None, 2.0], 1.0, 0.5) == pytest.approx(1.0 + 0.5 + 0.25 * 2.0)
    assert merged_reward([0.5], None) == 0.5
    with pytest.raises(ValueError):
        merged_reward([1.0], None, 1.5)


def test_sample_reward_and_span_rewards() -> None:
    """The sample reward follows the rule; spans keep raw per-call rewards at their positions."""
    answer = [marker(5), IM_END]
    first, second = two_turns([*answer, NL], answer)
    first.reward, second.reward = 1.0, -0.5
    (sample,), _ = merge([first, second], episode_reward=2.0, turn_discount=0.9)
    assert sample.reward == pytest.approx(2.0 + 1.0 - 0.9 * 0.5)
    assert [s.reward for s in sample.spans] == [1.0, -0.5]
    with pytest.raises(ValueError):
        merge([first], episode_reward=float("nan"))


# ---- modes, ids, report ----


def test_assemble_both_modes_have_distinct_ids() -> None:
    """Mode "both" gives per-call then merged samples; merged ids never equal per-call ids."""
    answer = [marker(5), IM_END]
    calls = two_turns([*answer, NL], answer)
    episode = EpisodeContext("ep", 1.0)
    samples, divergences = assemble(calls, episode, AssemblyOptions.of("both"))
    per_call = assemble_per_call(calls, episode)
    assert [s.sample_id for s in samples[:2]] == [s.sample_id for s in per_call]
    assert len(samples) == 3 and divergences == []
    assert len({s.sample_id for s in samples}) == 3
    merged_only, _ = assemble(calls, episode, AssemblyOptions.of("merged"))
    assert merged_only[0].sample_id == samples[2].sample_id  # deterministic
    by_default, _ = assemble(calls, episode)  # per-call when given no options
    assert [s.sample_id for s in by_default] == [s.sample_id for s in per_call]
    with pytest.raises(ValueError):
        AssemblyOptions.of("tree")


def test_modes_are_an_enum_and_plain_strings_still_work() -> None:
    """`AssemblyMode` members and their strings choose alike (with or without tokenizer hooks);
    a bad mode is a `ValueError` for assembly options and a `ConfigurationError` for the
    collector."""
    answer = [marker(5), IM_END]
    calls = two_turns([*answer, NL], answer)
    episode = EpisodeContext("ep", 1.0)
    by_string = assemble(calls, episode, AssemblyOptions.of("both"))
    by_member = assemble(calls, episode, AssemblyOptions(AssemblyMode.BOTH))
    options = AssemblyOptions.of("both", special_ids=SPECIAL_IDS, decode=decode)
    by_hooks = assemble(calls, episode, options)
    ids = [[s.sample_id for s in samples] for samples, _ in (by_string, by_member, by_hooks)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 3
    assert [m.value for m in AssemblyMode] == ["per_call", "merged", "both"]
    assert Collector(assembly="merged").settings.assembly is AssemblyMode.MERGED
    assert Collector(assembly=AssemblyMode.BOTH).settings.assembly is AssemblyMode.BOTH
    with pytest.raises(ConfigurationError, match="per_call, merged or both"):
        Collector(assembly="tree")
    with pytest.raises(ValueError, match="'per_call', 'merged' or 'both'"):
        AssemblyOptions.of("tree")


def test_report_counts_kinds_positions_and_excerpts() -> None:
    """The report gives calls, samples, per-episode counts and each divergence with an excerpt."""
    sampled = [marker(5), letter("d"), letter("a"), pair("ta"), IM_END]
    calls = two_turns([marker(5), pair("da"), pair("ta"), IM_END, NL], sampled)
    samples, divergences = merge(calls)
    report = assembly_report(samples, divergences)
    assert (report.episodes, report.calls, report.samples) == (1, 2, 2)
    assert report.samples_per_episode == 2.0
    assert report.trained_tokens == sum(c.num_sampled for c in calls)
    assert report.divergences_by_kind == {"retokenized": 1}
    assert report.positions_by_kind == {"retokenized": [len(PROMPT0) + 1]}
    assert report.start_reasons == {"episode_start": 1, "retokenized": 1}
    assert report.divergences[0]["excerpt"] == divergences[0].excerpt
    text = report.format()
    assert "retokenized 1" in text and "call=r1/0 after r0/0" in text
    assert report.to_dict()["divergences"][0]["kind"] == "retokenized"
    ids_only = merge(calls, text=False)[1][0].excerpt
    assert ids_only.startswith(f"@{len(PROMPT0) + 1} …[") and "old: [" in ids_only


def test_decode_failure_falls_back_to_ids() -> None:
    """A decode that raises only loses text: classification and excerpts fall back to ids."""

    def broken(ids: Sequence[int]) -> str:
        raise KeyError("no such token")

    sampled = [THINK, pair("hm"), END_THINK, marker(5), IM_END]
    calls = two_turns([marker(5), IM_END, NL], sampled)
    samples, divergences = assemble_merged(
        calls, EpisodeContext("e"), AssemblyOptions.of(decode=broken, special_ids=SPECIAL_IDS)
    )
    assert kinds(divergences) == [DivergenceKind.TEMPLATE_RERENDER]
    assert "old: [" in divergences[0].excerpt and len(samples) == 2


def test_helpers() -> None:
    """Prefix length and template normalisation on small literals."""
    a = np.array([1, 2, 3, 4], dtype=np.int32)
    assert common_prefix_len(a, a) == 4
    assert common_prefix_len(a, a[:2]) == 2
    assert common_prefix_len(a, np.array([1, 9], dtype=np.int32)) == 1
    assert common_prefix_len(a, np.zeros(0, dtype=np.int32)) == 0
    assert normalize_template_text("<think>x\n</think> ok<|im_end|>\n", ["<|im_end|>"]) == "ok"
    assert normalize_template_text("a <|eot_id|>b") == "ab"


def test_empty_episode() -> None:
    """No complete calls: no samples, no divergences, an empty report."""
    assert merge([]) == ([], [])
    report = assembly_report([], [])
    assert (report.episodes, report.samples, report.samples_per_episode) == (0, 0, 0.0)
