"""GRPO group statistics: population std, the three advantage modes, samples without a reward."""

from __future__ import annotations

import math

import pytest

from shared.batches.grpo import STD_EPSILON, group_stats


def test_grpo_normalises_by_the_population_std():
    stats = group_stats([1.0, 0.0, 1.0, 1.0])
    std = math.sqrt(3 / 16)
    assert stats["mean"] == 0.75 and stats["std"] == pytest.approx(std)
    scale = std + STD_EPSILON
    assert stats["advantages"] == pytest.approx([0.25 / scale, -0.75 / scale, 0.25 / scale, 0.25 / scale])


def test_mean_mode_only_centres_and_none_mode_gives_no_advantages():
    assert group_stats([2.0, 0.0], "mean")["advantages"] == [1.0, -1.0]
    assert group_stats([2.0, 0.0], "none")["advantages"] is None


def test_equal_rewards_give_zero_advantages_not_a_division_by_zero():
    assert group_stats([1.0, 1.0, 1.0])["advantages"] == [0.0, 0.0, 0.0]


def test_samples_without_a_reward_are_left_out_of_the_statistics():
    stats = group_stats([1.0, None, 0.0], "mean")
    assert stats["mean"] == 0.5 and stats["advantages"] == [0.5, None, -0.5]
    assert group_stats([None, None])["mean"] is None


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError):
        group_stats([1.0, 0.0], "ppo")
