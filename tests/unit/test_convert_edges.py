"""Converters on the inputs people really pass: odd ids, odd rewards, both views, bad widths.

Each case either converts correctly or raises a typed error (`ConversionError` / `ValueError`)
whose message says what to do; never a crash deep inside numpy, a NaN, or a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.convert_samples import merged_sample, single_sample
from tito_agents.convert import (
    ConversionError,
    group_advantages,
    group_key,
    pack_batch,
    pack_batches,
    pad_batch,
    pad_split_batch,
    stable_int_id,
    to_agent_loop_outputs,
    to_trl_rollout,
    to_trl_rollout_samples,
    to_verl_batch,
)
from tito_agents.samples import Sample
from tito_agents.sinks import JsonlSink, read_samples

Convert = Callable[[Sequence[Sample]], Any]

# Every converter that reads rewards or defines GRPO groups (what a trainer's update depends on).
TRAINING_CONVERTERS: dict[str, Convert] = {
    "group_advantages": lambda s: group_advantages(s, missing_reward="exclude"),
    "to_verl_batch": lambda s: to_verl_batch(s),
    "to_agent_loop_outputs": lambda s: to_agent_loop_outputs(s),
    "to_trl_rollout": lambda s: to_trl_rollout(s),
    "to_trl_rollout_samples": lambda s: to_trl_rollout_samples(s, model_version=0),
}


def _group(rewards: Sequence[float | None], group_id: Any = "g") -> list[Sample]:
    """One rollout per reward, each its own episode, all in `group_id`."""
    samples = []
    for i, reward in enumerate(rewards):
        sample = single_sample(reward=reward, episode_id=f"e{i}")
        sample.sample_id = f"s{i}"
        sample.group_id = group_id
        samples.append(sample)
    return samples


def test_integer_group_ids_convert_like_their_string() -> None:
    """An int or numpy int group id (hand-built, or an old file) is the group its str names: no
    AttributeError in stable_int_id, no TypeError sorting ints against strings."""
    samples = _group([0.0, 1.0], group_id=np.int64(3)) + _group([2.0], group_id="3")
    samples[2].episode_id = "e2"
    assert {group_key(s) for s in samples} == {"3"}
    records = to_trl_rollout_samples(samples, model_version=0)
    assert {r["group_id"] for r in records} == {stable_int_id("3")}
    np.testing.assert_allclose(group_advantages(samples), [-1.0, 0.0, 1.0], atol=1e-5)
    mixed = _group([0.0], group_id=7) + _group([1.0], group_id="a")
    mixed[1].episode_id = "e1"
    np.testing.assert_allclose(group_advantages(mixed), [0.0, 1.0], atol=1e-5)
    assert to_verl_batch(mixed).non_tensors()["uid"].tolist() == ["7", "a"]


def test_integer_task_id_read_back_from_an_old_file(tmp_path: Path) -> None:
    """A JSON Lines file whose samples hold int task ids (no group id) converts after reading."""
    samples = _group([0.0, 1.0], group_id=None)
    for sample in samples:
        sample.task_id = 17  # type: ignore[assignment]  # what an older writer stored
    path = tmp_path / "old.jsonl"
    sink = JsonlSink(path)
    sink.write(samples)
    sink.close()
    back = list(read_samples(path))
    assert [s.task_id for s in back] == [17, 17]  # type: ignore[comparison-overlap]
    records = to_trl_rollout_samples(back, model_version=0)
    assert [r["group_id"] for r in records] == [stable_int_id("17")] * 2
    assert [r["advantage"] for r in records] == pytest.approx([-0.7071, 0.7071], abs=1e-4)


@pytest.mark.parametrize("reward", [float("inf"), float("-inf"), float("nan"), 1e300, 1e39])
@pytest.mark.parametrize("name", sorted(TRAINING_CONVERTERS))
def test_rewards_no_trainer_can_use_are_refused(name: str, reward: float) -> None:
    """A NaN, infinite or beyond-float32 reward raises ConversionError naming the sample, in every
    converter that hands rewards on (let through, it would become NaN advantages or an inf
    rm_score, or, for NaN, count silently as 'no reward')."""
    samples = _group([reward, 1.0])
    with pytest.raises(ConversionError, match=r"sample s0: reward .* not a finite float32"):
        TRAINING_CONVERTERS[name](samples)


def test_the_reward_bound_is_float32() -> None:
    """Rewards up to float32's largest convert (the usual z-scores); just beyond it, refused."""
    adv = group_advantages(_group([-3e38, 3e38]))
    np.testing.assert_allclose(adv, [-0.7071, 0.7071], atol=1e-4)
    with pytest.raises(ConversionError, match="not a finite float32"):
        to_verl_batch(_group([3.5e38, 0.0]))


def test_equal_rewards_with_zero_epsilon_give_zero_not_nan() -> None:
    """epsilon=0 (exact std normalisation) on a group with no spread: advantage 0, not 0/0."""
    adv = group_advantages(_group([1.0, 1.0, 0.0, 2.0]), epsilon=0.0)
    assert np.isfinite(adv).all()
    constant = group_advantages(_group([1.0, 1.0]), epsilon=0.0)
    assert constant.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="epsilon must be >= 0"):
        group_advantages(_group([1.0, 0.0]), epsilon=-1.0)


def _both_views() -> list[Sample]:
    """assembly="both" for one episode: the per-call sample, then the merged one."""
    per_call = single_sample(episode_id="ep", reward=1.0)
    merged = single_sample(episode_id="ep", reward=1.0)
    merged.sample_id, merged.view, merged.start_reason = "m", "merged", "episode_start"
    other = single_sample(episode_id="ep2", reward=0.0)
    other.sample_id = "o"
    return [per_call, merged, other]


@pytest.mark.parametrize("name", sorted(TRAINING_CONVERTERS))
def test_both_views_of_one_episode_are_refused(name: str) -> None:
    """The per-call and merged samples of one episode hold the same sampled tokens: together
    they would train the rollout, and count it in its group, twice."""
    with pytest.raises(ConversionError, match="episode ep: both per_call and merged"):
        TRAINING_CONVERTERS[name](_both_views())


def test_one_view_per_episode_is_accepted_across_episodes() -> None:
    """Only the same episode in both views is refused: per-call samples of one episode beside the
    merged sample of another convert fine."""
    samples = _both_views()
    with pytest.raises(ConversionError, match="train on one view"):
        group_advantages(samples)
    samples[2].view = "merged"
    np.testing.assert_allclose(
        group_advantages([samples[0], samples[2]]), [0.7071, -0.7071], atol=1e-4
    )


def test_reward_key_cannot_overwrite_a_rollout_field() -> None:
    """reward_key="prompt_ids" is refused: it would replace the prompts with the rewards, silently."""
    with pytest.raises(ValueError, match="reward_key 'prompt_ids' would overwrite"):
        to_trl_rollout([single_sample()], reward_key="prompt_ids")


@pytest.mark.parametrize("pad_id", [None, 1.5, -1, 2**40, True])
def test_pad_id_must_be_a_token_id(pad_id: Any) -> None:
    """pad_id=tokenizer.pad_token_id is None for many tokenizers: a ValueError that says what to
    pass, not a numpy TypeError; a float or negative id never lands in input_ids."""
    samples = [merged_sample(), single_sample()]
    for convert in (pad_batch, pad_split_batch, to_verl_batch):
        with pytest.raises(ValueError, match="pad_id must be"):
            convert(samples, pad_id=pad_id)


def test_pad_id_none_names_the_fix_and_numpy_ids_work() -> None:
    """The None message points at eos_token_id; a numpy integer pad id is a valid id."""
    with pytest.raises(ValueError, match="eos_token_id"):
        pad_batch([single_sample()], pad_id=None)  # type: ignore[arg-type]
    batch = pad_batch([merged_sample(), single_sample()], pad_id=np.int64(7))  # type: ignore[arg-type]
    assert batch.input_ids[1, -1] == 7


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"response_length": 0}, "response_width"),
        ({"response_length": -1}, "response_width"),
        ({"prompt_length": -1}, "prompt_width"),
    ],
)
def test_verl_widths_below_one_token_are_refused(kwargs: dict[str, int], name: str) -> None:
    """A zero or negative width is refused with overflow='truncate', before numpy fails on it
    (IndexError on rm_scores, negative dimensions)."""
    with pytest.raises(ValueError, match=f"{name} must be an int >= "):
        to_verl_batch([merged_sample(), single_sample()], overflow="truncate", **kwargs)


@pytest.mark.parametrize("width", [0, -3])
def test_pad_width_below_one_token_is_refused(width: int) -> None:
    """pad_batch(width=0 or negative, overflow='truncate') is a ValueError, not a numpy crash."""
    with pytest.raises(ValueError, match="width must be an int >= 1"):
        pad_batch([merged_sample()], width=width, overflow="truncate")


def test_empty_samples_shift_to_empty_targets() -> None:
    """A batch of 0-token samples (hand-built) pads and packs to empty arrays, and shifting them
    gives empty targets instead of an IndexError."""
    empty = single_sample()
    empty.token_ids = np.zeros(0, dtype=np.int32)
    empty.loss_mask = np.zeros(0, dtype=np.uint8)
    empty.logprobs = np.zeros(0, dtype=np.float32)
    empty.spans = []
    left = pad_batch([empty], padding_side="left").shifted()
    assert left.labels.shape == (1, 0)
    packed = pack_batch([empty]).shifted()
    assert packed.labels.shape == (0,)


def test_non_finite_advantages_are_refused() -> None:
    """Caller-given advantages with a NaN or inf are refused, never broadcast into the batch."""
    samples = [merged_sample(), single_sample()]
    bad = [float("nan"), 1.0]
    with pytest.raises(ValueError, match=r"advantages\[0\] is nan"):
        pack_batch(samples, advantages=bad)
    with pytest.raises(ValueError, match=r"advantages\[1\] is inf"):
        pack_batches(samples, 100, advantages=[0.0, float("inf")])
    with pytest.raises(ValueError, match=r"advantages\[0\] is nan"):
        to_trl_rollout_samples(samples, advantages=bad, model_version=0)
