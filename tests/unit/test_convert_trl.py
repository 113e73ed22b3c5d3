"""TRL hand-off: `rollout_func` values and AsyncGRPO `RolloutSample` fields, position by position.

`test_convert_trl_real.py` feeds the same values to TRL's own trainer code.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.support.convert_samples import build_sample, merged_sample, single_sample
from tito_agents.convert import (
    ConversionError,
    group_advantages,
    passthrough_reward,
    stable_int_id,
    to_trl_rollout,
    to_trl_rollout_samples,
)

MERGED_COMPLETION = [201, 202, 301, 302, 303, 203, 204, 205, 304, 206]
MERGED_ENV_MASK = [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]


def test_rollout_func_values_put_tool_tokens_inside_the_completion_with_env_mask_0() -> None:
    """prompt_ids end before the first sampled token; completion_ids hold the rest, and env_mask is
    0 exactly on the tool / template tokens between the sampled spans."""
    out = to_trl_rollout([merged_sample(reward=1.0), single_sample(reward=0.0)])
    assert out["prompt_ids"] == [[101, 102, 103, 104], [111, 112]]
    assert out["completion_ids"] == [MERGED_COMPLETION, [211, 212, 213, 214]]
    assert out["env_mask"] == [MERGED_ENV_MASK, [1, 1, 1, 1]]
    assert out["logprobs"][0] == pytest.approx(
        [-t / 1000 if m else 0.0 for t, m in zip(MERGED_COMPLETION, MERGED_ENV_MASK, strict=True)]
    )
    assert out["logprobs"][1] == pytest.approx([-0.211, -0.212, -0.213, -0.214])
    assert out["reward"] == [1.0, 0.0]
    for key in ("prompt_ids", "completion_ids", "env_mask"):
        assert all(type(v) is int for row in out[key] for v in row)
    assert all(type(v) is float for row in out["logprobs"] for v in row)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward"}


def test_rollout_without_logprobs_gives_none_per_token_and_extras_are_forwarded() -> None:
    """Missing logprobs become None per completion token; extra fields ride along, one per sample."""
    out = to_trl_rollout(
        [single_sample(with_logprobs=False)], reward_key=None, extra_fields={"task": ["t1"]}
    )
    assert out["logprobs"] == [[None, None, None, None]]
    assert out["task"] == ["t1"]
    assert "reward" not in out
    with pytest.raises(ValueError, match="overwrite"):
        to_trl_rollout([single_sample()], extra_fields={"env_mask": [[1]]})
    with pytest.raises(ValueError, match="1 values for 2"):
        to_trl_rollout([single_sample(), single_sample()], extra_fields={"x": [1]})


def test_num_generations_checks_consecutive_groups_and_one_row_per_episode() -> None:
    """With num_generations, samples must come in whole consecutive blocks of one group each."""
    ok = [single_sample(group_id=g, episode_id=f"{g}{i}") for g in "ab" for i in range(2)]
    assert len(to_trl_rollout(ok, num_generations=2)["prompt_ids"]) == 4
    with pytest.raises(ConversionError, match="not in the group of its block"):
        to_trl_rollout([ok[0], ok[2], ok[1], ok[3]], num_generations=2)
    with pytest.raises(ConversionError, match="whole groups"):
        to_trl_rollout(ok[:3], num_generations=2)
    twice = [single_sample(episode_id="e"), single_sample(episode_id="e")]
    with pytest.raises(ConversionError, match="several samples"):
        to_trl_rollout(twice, num_generations=2)


def test_passthrough_reward_returns_the_forwarded_rewards() -> None:
    """The pass-through reward function hands TRL the rewards forwarded by `to_trl_rollout`."""
    out = to_trl_rollout([single_sample(reward=2), single_sample(reward=None)])
    assert passthrough_reward(["p", "p"], ["c", "c"], out["reward"], trainer_state=None) == [
        2.0,
        None,
    ]


def test_rollout_sample_fields_are_flat_unshifted_arrays() -> None:
    """AsyncGRPO records hold the full sequence, loss bits as completion_mask, rollout logprobs as
    old_log_probs (0.0 off the trained tokens), with TRL's dtypes."""
    samples = [merged_sample(reward=1.0, episode_id="a"), single_sample(reward=0.0, episode_id="b")]
    first, second = to_trl_rollout_samples(samples, model_version=4)
    assert first["input_ids"].tolist() == [101, 102, 103, 104, *MERGED_COMPLETION]
    assert first["completion_mask"].tolist() == [0, 0, 0, 0, *MERGED_ENV_MASK]
    assert first["input_ids"].dtype == np.int64 and first["completion_mask"].dtype == np.int64
    assert first["old_log_probs"].dtype == np.float32
    assert first["old_log_probs"].tolist() == pytest.approx(
        [0.0] * 4
        + [-t / 1000 if m else 0.0 for t, m in zip(MERGED_COMPLETION, MERGED_ENV_MASK, strict=True)]
    )
    z = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert (first["advantage"], second["advantage"]) == pytest.approx((z, -z))
    assert first["group_id"] == second["group_id"] == stable_int_id("g")
    assert first["model_version"] == 4
    assert first["metrics"] == {"reward": 1.0}
    assert (first["prompt"], first["completion"]) == ([], [])


def test_rollout_samples_default_advantages_are_per_episode_and_missing_reward_is_zero() -> None:
    """Default advantages count each episode once; an unscored sample gets advantage 0 and NaN."""
    pieces = [("ctx", [1, 2]), ("gen", [3])]
    samples = [
        build_sample(pieces, sample_id="a1", episode_id="A", reward=1.0, policy_version="2"),
        build_sample(pieces, sample_id="a2", episode_id="A", reward=1.0, policy_version="3"),
        build_sample(pieces, sample_id="b", episode_id="B", reward=0.0, policy_version="2"),
        build_sample(pieces, sample_id="c", episode_id="C", reward=None, policy_version="2"),
    ]
    records = to_trl_rollout_samples(samples)
    expected = group_advantages(samples, unit="episode", missing_reward="exclude")
    assert [r["advantage"] for r in records] == pytest.approx(expected.tolist())
    assert records[3]["advantage"] == 0.0 and math.isnan(records[3]["metrics"]["reward"])
    assert [r["model_version"] for r in records] == [2, 3, 2, 2]


def test_rollout_samples_refuse_what_trl_cannot_use() -> None:
    """No logprobs, or no model version at all, is refused rather than guessed."""
    with pytest.raises(ConversionError, match="no logprobs"):
        to_trl_rollout_samples([single_sample(with_logprobs=False)], model_version=0)
    with pytest.raises(ConversionError, match="model_version"):
        to_trl_rollout_samples([single_sample()])
