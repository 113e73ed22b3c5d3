"""SkyRL `GeneratorOutput` rows, checked against SkyRL's field contract position by position.

The contract (skyrl 0.4.0 `train/generators/base.py`, `train/utils/trainer_utils.py`
`validate_generator_output`): per row unpadded `prompt_token_ids`, `response_ids`, `loss_masks`
and `rollout_logprobs` of the response's length, a scalar reward; step-wise rows of a trajectory
adjacent, `is_last_step` on its last. tests/skyrl runs the real skyrl on them.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.convert_samples import build_sample, logprob_of, merged_sample
from tito_agents.convert import ConversionError, to_skyrl_steps
from tito_agents.samples import Sample, trajectory_id_for

MERGED_RESPONSE = [201, 202, 301, 302, 303, 203, 204, 205, 304, 206]
MERGED_RESPONSE_MASK = [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]


def segment(index: int, first: int, *, reward: float, trajectory: str = "t") -> Sample:
    """Segment `index` of trajectory `trajectory`: a 2-token prompt and a 2-token answer."""
    sample = build_sample(
        [("ctx", [first, first + 1]), ("gen", [first + 2, first + 3])],
        sample_id=f"{trajectory}-{index}",
        episode_id=f"ep-{trajectory}",
        reward=reward,
    )
    return dataclasses.replace(sample, view="merged", trajectory_id=trajectory, segment_index=index)


def test_a_merged_sample_is_one_row_with_every_token_mask_bit_and_logprob() -> None:
    (row,) = to_skyrl_steps([merged_sample(reward=0.5)])
    assert row["prompt_token_ids"] == [101, 102, 103, 104]
    assert row["response_ids"] == MERGED_RESPONSE
    assert row["loss_mask"] == MERGED_RESPONSE_MASK
    assert row["rollout_logprobs"] == pytest.approx(
        [
            logprob_of(t) if m else 0.0
            for t, m in zip(MERGED_RESPONSE, MERGED_RESPONSE_MASK, strict=True)
        ]
    )
    assert row["reward"] == 0.5
    assert row["stop_reason"] == "stop"
    assert row["is_last_step"] is True
    assert row["trajectory_id"] == trajectory_id_for("ep-merged", "main")


def test_linked_segments_become_adjacent_steps_in_order_with_the_reward_on_the_last() -> None:
    """Segments given out of order and interleaved with another trajectory come out as adjacent
    steps, in segment order; only the last step of each carries the reward."""
    samples = [
        segment(1, 20, reward=1.0, trajectory="a"),
        segment(0, 40, reward=0.25, trajectory="b"),
        segment(0, 10, reward=1.0, trajectory="a"),
    ]
    rows = to_skyrl_steps(samples)
    assert [(r["trajectory_id"], r["segment_index"]) for r in rows] == [
        ("a", 0),
        ("a", 1),
        ("b", 0),
    ]
    assert [r["is_last_step"] for r in rows] == [False, True, True]
    assert [r["reward"] for r in rows] == [0.0, 1.0, 0.25]
    assert rows[0]["prompt_token_ids"] == [10, 11]
    assert rows[1]["prompt_token_ids"] == [20, 21]
    assert rows[1]["response_ids"] == [22, 23]


def test_without_logprobs_the_row_says_none() -> None:
    (row,) = to_skyrl_steps([merged_sample(with_logprobs=False)])
    assert row["rollout_logprobs"] is None


def test_a_sample_without_a_reward_is_refused() -> None:
    with pytest.raises(ConversionError, match="no reward"):
        to_skyrl_steps([merged_sample(reward=None)])


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        to_skyrl_steps([])
