"""GRPO, Dr.GRPO, RLOO and REINFORCE++ advantages against hand-computed values."""

import math

import pytest
import torch

from flywheel.trainer.advantages import compute_advantages, drgrpo_advantages, grpo_advantages, weight_negatives


def test_grpo_normalises_by_group_mean_and_unbiased_std():
    # group a: mean 0.5, unbiased std sqrt(0.5) -> +-0.5/0.70711; group b: all equal -> 0
    adv = grpo_advantages([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"])
    expected = [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0, 0.0]
    assert adv.dtype == torch.float32
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)


def test_grpo_three_members_and_interleaved_groups():
    # group x = [0, 1, 2]: mean 1, unbiased std 1; group y = [3, 5]: mean 4, std sqrt(2)
    adv = grpo_advantages([0.0, 3.0, 1.0, 5.0, 2.0], ["x", "y", "x", "y", "x"])
    assert adv.tolist() == pytest.approx([-1.0, -1 / math.sqrt(2), 0.0, 1 / math.sqrt(2), 1.0], abs=1e-5)


def test_drgrpo_subtracts_the_group_mean_only():
    adv = drgrpo_advantages([1.0, 0.0, 1.0, 1.0, 0.0, 3.0], [0, 0, 1, 1, 2, 2])
    assert adv.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, -1.5, 1.5], abs=1e-6)


def test_singleton_groups_get_zero_advantage():
    assert grpo_advantages([1.0, 0.3], ["a", "b"]).tolist() == [0.0, 0.0]
    assert drgrpo_advantages([1.0, 0.3], ["a", "b"]).tolist() == [0.0, 0.0]


def test_compute_advantages_dispatches_and_rejects_bad_input():
    r, g = [0.0, 2.0], ["t", "t"]
    assert compute_advantages(r, g, "drgrpo").tolist() == [-1.0, 1.0]
    assert compute_advantages(r, g, "grpo").tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=1e-5)
    with pytest.raises(ValueError, match="choose one of"):
        compute_advantages(r, g, "ppo")
    with pytest.raises(ValueError, match="one group id per trajectory"):
        grpo_advantages([1.0, 2.0, 3.0], ["a", "a"])
    with pytest.raises(ValueError, match="finite"):
        drgrpo_advantages([1.0, float("nan")], ["a", "a"])
    assert grpo_advantages([], []).numel() == 0


def test_weight_negatives_scales_only_the_negative_advantages():
    # Group [1, 0, 0, 0]: mean 0.25, unbiased std 0.5 -> A = [1.5, -0.5, -0.5, -0.5].
    adv = grpo_advantages([1.0, 0.0, 0.0, 0.0], ["g"] * 4)
    assert weight_negatives(adv, 0.2).tolist() == pytest.approx([1.5, -0.1, -0.1, -0.1], rel=1e-5)
    assert weight_negatives(adv, 0.0).tolist() == pytest.approx([1.5, 0.0, 0.0, 0.0], rel=1e-5)
    assert torch.equal(weight_negatives(adv, 1.0), adv)
    with pytest.raises(ValueError, match="negative_weight"):
        weight_negatives(adv, -1.0)


def test_rloo_subtracts_the_mean_of_the_others():
    # group a = [1, 0, 1, 0]: others' mean of a 1 is 1/3 -> 2/3, of a 0 is 2/3 -> -2/3; a singleton gets 0
    adv = compute_advantages([1.0, 0.0, 1.0, 0.0, 5.0], ["a", "a", "a", "a", "s"], "rloo")
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3, 0.0], abs=1e-6)


def test_reinforce_pp_whitens_over_loss_tokens():
    # unweighted: mean 0.5, unbiased var (4 * 0.25) / 3 -> +-0.5 / sqrt(1/3)
    adv = compute_advantages([1.0, 0.0, 0.0, 1.0], ["a", "b", "c", "d"], "reinforce_pp")
    h = 0.5 * math.sqrt(3)
    assert adv.tolist() == pytest.approx([h, -h, -h, h], abs=1e-5)
    # token weights [1, 1, 2, 0]: mean 1/4, var (0.5625 + 0.0625 + 2 * 0.0625) / (4 - 1) = 0.25; weight 0 -> 0
    adv = compute_advantages([1.0, 0.0, 0.0, 1.0], ["a", "b", "c", "d"], "reinforce_pp", num_tokens=[1, 1, 2, 0])
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, 0.0], abs=1e-5)
    assert compute_advantages([3.0], ["a"], "reinforce_pp").tolist() == [0.0]  # one trajectory: no spread
    with pytest.raises(ValueError, match="num_tokens"):
        compute_advantages([1.0, 0.0], ["a", "b"], "reinforce_pp", num_tokens=[1])


def test_reinforce_pp_baseline_centres_per_group_then_whitens():
    # centred [0.5, -0.5, 1, -1] (the singleton c stays 0 and out of the statistics): mean 0, var 2.5 / 3
    adv = compute_advantages([1.0, 0.0, 3.0, 1.0, 5.0], ["a", "a", "b", "b", "c"], "reinforce_pp_baseline")
    sd = math.sqrt(2.5 / 3)
    assert adv.tolist() == pytest.approx([0.5 / sd, -0.5 / sd, 1 / sd, -1 / sd, 0.0], abs=1e-5)
