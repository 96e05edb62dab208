"""The policy loss, off-policy weights, KL and aggregation against hand-computed values.

Shared setup: old log-probs 0, so the PPO ratio is exp(logprobs); ratios [1.5, 0.5, 1.0] in both rows,
advantages +1 (row 0) and -1 (row 1), clip 0.2/0.2. Hand-computed token losses -min(rA, clip(r)A):
row 0: [-1.2, -0.5, -1.0] (token 0 clipped), row 1: [1.5, 0.8, 1.0] (token 1 clipped).
"""

import math

import pytest
import torch

from flywheel.config import TrainerConfig
from flywheel.trainer.losses import (
    aggregation_weights,
    cispo_token_loss,
    correction_weights,
    dual_clip_token_loss,
    gspo_token_loss,
    kl_k3,
    kl_k3_clamped,
    loss_options,
    policy_loss,
    ppo_token_loss,
    sapo_token_loss,
)
from flywheel.trainer.mismatch import mismatch_metrics

RATIOS = [[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]]
TOKEN_LOSS = [[-1.2, -0.5, -1.0], [1.5, 0.8, 1.0]]


def close(t: torch.Tensor, expected, atol: float) -> bool:
    torch.testing.assert_close(t.detach().float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)
    return True


RHO = [[4.0, 1.0, 0.25], [0.4, 1.5, 3.0]]  # pi_old / mu per token


def setup():
    logprobs = torch.tensor(RATIOS).log().requires_grad_(True)
    old = torch.zeros(2, 3)
    sampler = -torch.tensor(RHO).log()  # old - sampler = log rho
    adv = torch.tensor([1.0, -1.0])
    return logprobs, old, sampler, adv


def test_ppo_clip_token_losses_and_clip_positions():
    logprobs, old, _, adv = setup()
    loss, clipped = ppo_token_loss(logprobs, old, adv, 0.2, 0.2)
    assert close(loss, TOKEN_LOSS, 1e-6)
    assert clipped.tolist() == [[True, False, False], [False, True, False]]
    # asymmetric clip-higher: eps_high 0.6 lets ratio 1.5 through for A > 0
    loss_hi, _ = ppo_token_loss(logprobs, old, adv, 0.2, 0.6)
    assert loss_hi[0, 0].item() == pytest.approx(-1.5)


def test_policy_loss_token_mean_value_and_gradient():
    logprobs, old, sampler, adv = setup()
    loss, m = policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), clip_eps_low=0.2, clip_eps_high=0.2,
                          correction="none")
    assert loss.item() == pytest.approx(0.6 / 6, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(2 / 6) and m["num_tokens"] == 6
    loss.backward()
    # d/dlogp of -r*A is -r*A (0 where clipped), times 1/6
    expected = [[0.0, -0.5 / 6, -1.0 / 6], [1.5 / 6, 0.0, 1.0 / 6]]
    assert close(logprobs.grad, expected, 1e-6)


def test_per_token_advantages_equal_broadcast_row_advantages():
    logprobs, old, sampler, adv = setup()
    a, _ = policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), correction="none")
    b, _ = policy_loss(logprobs, old, sampler, adv[:, None].expand(2, 3), torch.ones(2, 3), correction="none")
    assert a.item() == pytest.approx(b.item(), abs=1e-7)


def test_aggregations_with_a_masked_token():
    logprobs, old, sampler, adv = setup()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kw = dict(clip_eps_low=0.2, clip_eps_high=0.2, correction="none")
    tok, _ = policy_loss(logprobs, old, sampler, adv, mask, aggregation="token_mean", **kw)
    assert tok.item() == pytest.approx(-0.4 / 5, abs=1e-6)
    seq, _ = policy_loss(logprobs, old, sampler, adv, mask, aggregation="seq_mean", **kw)
    assert seq.item() == pytest.approx((-2.7 / 3 + 2.3 / 2) / 2, abs=1e-6)
    # both rows are segments of one trajectory: seq_mean over one sequence = its token mean
    one, _ = policy_loss(logprobs, old, sampler, adv, mask, aggregation="seq_mean", seq_ids=[7, 7], **kw)
    assert one.item() == pytest.approx(-0.4 / 5, abs=1e-6)
    dr, _ = policy_loss(logprobs, old, sampler, adv, mask, aggregation="token_sum", norm_tokens=10, **kw)
    assert dr.item() == pytest.approx(-0.4 / (2 * 10), abs=1e-6)
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregation_weights(mask, "token_sum")
    with pytest.raises(ValueError, match="choose one of"):
        aggregation_weights(mask, "sum")


def test_token_tis_weights_and_loss():
    logprobs, old, sampler, adv = setup()
    w, m = correction_weights(old, sampler, torch.ones(2, 3), "tis", cap=2.0)
    assert close(w, [[2.0, 1.0, 0.25], [0.4, 1.5, 2.0]], 1e-6)
    assert m["is_clip_frac"] == pytest.approx(2 / 6) and m["is_mask_frac"] == 0.0
    loss, _ = policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), clip_eps_low=0.2, clip_eps_high=0.2,
                          correction="tis", tis_cap=2.0)
    # sum of token loss x weight: -2.4 - 0.5 - 0.25 + 0.6 + 1.2 + 2.0 = 0.65
    assert loss.item() == pytest.approx(0.65 / 6, abs=1e-6)


def test_icepop_masks_out_of_band_tokens_and_keeps_the_ratio():
    _, old, sampler, _ = setup()
    w, m = correction_weights(old, sampler, torch.ones(2, 3), "icepop", alpha=0.5, beta=2.0)
    assert close(w, [[0.0, 1.0, 0.0], [0.0, 1.5, 0.0]], 1e-6)
    assert m["is_mask_frac"] == pytest.approx(4 / 6)


def test_sequence_level_tis_and_mis():
    _, old, sampler, _ = setup()
    ones = torch.ones(2, 3)
    # sequence ratios: row 0: 4 * 1 * 0.25 = 1.0, row 1: 0.4 * 1.5 * 3 = 1.8
    w, m = correction_weights(old, sampler, ones, "tis_seq", cap=2.0)
    assert close(w, [[1.0] * 3, [1.8] * 3], 1e-5) and m["is_clip_frac"] == 0.0
    w, m = correction_weights(old, sampler, ones, "tis_seq", cap=1.5)
    assert close(w, [[1.0] * 3, [1.5] * 3], 1e-5) and m["is_clip_frac"] == pytest.approx(0.5)
    w, m = correction_weights(old, sampler, ones, "mis", cap=1.5)
    assert close(w, [[1.0] * 3, [0.0] * 3], 1e-5) and m["is_mask_frac"] == pytest.approx(0.5)
    # masked tokens do not count: row 1 with its last token masked has ratio 0.4 * 1.5 = 0.6
    w, _ = correction_weights(old, sampler, torch.tensor([[1, 1, 1], [1, 1, 0]]), "mis", cap=1.5)
    assert close(w, [[1.0] * 3, [0.6, 0.6, 0.0]], 1e-5)
    # two segments of one trajectory share one sequence ratio 1.0 * 1.8
    w, _ = correction_weights(old, sampler, ones, "tis_seq", cap=2.0, seq_ids=torch.tensor([3, 3]))
    assert close(w, [[1.8] * 3, [1.8] * 3], 1e-5)
    w, _ = correction_weights(old, sampler, ones, "none")
    assert w.tolist() == [[1.0] * 3] * 2
    with pytest.raises(ValueError, match="choose one of"):
        correction_weights(old, sampler, ones, "ppo")


def test_kl_k3_values_and_kl_term():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[math.log(2.0), math.log(0.5)]])
    assert kl_k3(logprobs, ref).tolist()[0] == pytest.approx([1 - math.log(2), math.log(2) - 0.5], abs=1e-6)
    old = torch.zeros(1, 2)
    base, _ = policy_loss(logprobs, old, old, torch.tensor([1.0]), torch.ones(1, 2), correction="none")
    with_kl, m = policy_loss(logprobs, old, old, torch.tensor([1.0]), torch.ones(1, 2), correction="none",
                             ref_logprobs=ref, kl_coef=0.1)
    kl_mean = (1 - math.log(2) + math.log(2) - 0.5) / 2
    assert with_kl.item() - base.item() == pytest.approx(0.1 * kl_mean, abs=1e-6)
    assert m["kl"] == pytest.approx(kl_mean, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logprobs, old, old, torch.tensor([1.0]), torch.ones(1, 2), kl_coef=0.1)


def test_micro_batches_with_global_weights_sum_to_the_full_loss():
    logprobs, old, sampler, adv = setup()
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    seq = torch.tensor([0, 1])
    for agg in ("token_mean", "seq_mean"):
        w, _ = correction_weights(old, sampler, mask, "tis_seq", cap=2.0, seq_ids=seq)
        rw = aggregation_weights(mask, agg, seq)
        full, _ = policy_loss(logprobs, old, sampler, adv, mask, correction="tis_seq", aggregation=agg, seq_ids=seq)
        parts = [policy_loss(logprobs[i:i + 1], old[i:i + 1], sampler[i:i + 1], adv[i:i + 1], mask[i:i + 1],
                             is_weights=w[i:i + 1], row_weights=rw[i:i + 1])[0].item() for i in range(2)]
        assert sum(parts) == pytest.approx(full.item(), abs=1e-6)


def test_shape_errors_and_loss_options():
    logprobs, old, sampler, adv = setup()
    with pytest.raises(ValueError, match="one \\[B, T\\] shape"):
        policy_loss(logprobs, old[:, :2], sampler, adv, torch.ones(2, 3))
    with pytest.raises(ValueError, match="one entry per row"):
        policy_loss(logprobs, old, sampler, torch.ones(3), torch.ones(2, 3))
    opts = loss_options(TrainerConfig(correction="icepop", aggregation="token_sum", norm_tokens=64))
    assert opts["correction"] == "icepop" and opts["norm_tokens"] == 64 and opts["clip_eps_high"] == 0.28


def test_mismatch_metrics_hand_computed():
    _, old, sampler, _ = setup()
    d = [math.log(x) for row in RHO for x in row]
    rho = [x for row in RHO for x in row]
    m = mismatch_metrics(old, sampler, torch.ones(2, 3), tis_cap=2.0, icepop_alpha=0.5, icepop_beta=2.0)
    assert m["k1"] == pytest.approx(-math.log(1.8) / 6, abs=1e-6)
    assert m["k3"] == pytest.approx((sum(rho) - 6 - math.log(1.8)) / 6, abs=1e-6)
    assert m["mean_abs_diff"] == pytest.approx(sum(abs(x) for x in d) / 6, abs=1e-6)
    assert m["max_abs_diff"] == pytest.approx(math.log(4), abs=1e-6)
    assert m["frac_outside_0.5_2"] == pytest.approx(4 / 6) and m["frac_outside_0.2_5"] == 0.0
    assert m["seq_log_ratio_mean"] == pytest.approx(math.log(1.8) / 2, abs=1e-6)
    assert m["seq_log_ratio_max_abs"] == pytest.approx(math.log(1.8), abs=1e-6)
    assert m["tis_clip_frac"] == pytest.approx(2 / 6) and m["icepop_mask_frac"] == pytest.approx(4 / 6)
    # masked tokens are ignored; two rows of one trajectory form one sequence
    m2 = mismatch_metrics(old, sampler, torch.tensor([[1, 0, 0], [0, 0, 1]]), seq_ids=[5, 5])
    assert m2["max_abs_diff"] == pytest.approx(math.log(4), abs=1e-6)
    assert m2["seq_log_ratio_mean"] == pytest.approx(math.log(12), abs=1e-6)
    assert m2["frac_outside_0.2_5"] == 0.0 and m2["frac_outside_0.5_2"] == 1.0
    assert mismatch_metrics(old, sampler, torch.zeros(2, 3))["k3"] == 0.0


# ---------------------------------------------------------------- the other surrogates (trainer.loss), same setup


def test_dual_clip_bounds_negative_advantage_losses():
    logprobs, old, _, adv = setup()
    # row 1 (A = -1): PPO losses [1.5, 0.8, 1.0]; with clip_ratio_c = 1.2 the 1.5 is cut to 1.2 (no gradient)
    loss, clipped = dual_clip_token_loss(logprobs, old, adv, 0.2, 0.2, clip_ratio_c=1.2)
    assert close(loss, [[-1.2, -0.5, -1.0], [1.2, 0.8, 1.0]], 1e-6)
    assert clipped.tolist() == [[True, False, False], [True, True, False]]
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        dual_clip_token_loss(logprobs, old, adv, clip_ratio_c=1.0)


def test_cispo_weights_the_log_prob_with_the_clipped_ratio_without_its_gradient():
    logprobs, old, _, adv = setup()
    loss, clipped = cispo_token_loss(logprobs, old, adv, 0.2, 0.2)
    w = [1.2, 0.8, 1.0]  # clip([1.5, 0.5, 1.0], 0.8, 1.2)
    lp = [math.log(r) for r in RATIOS[0]]
    assert close(loss, [[-wi * x for wi, x in zip(w, lp)], [wi * x for wi, x in zip(w, lp)]], 1e-6)
    assert clipped.tolist() == [[True, True, False]] * 2
    loss.sum().backward()
    assert close(logprobs.grad, [[-1.2, -0.8, -1.0], [1.2, 0.8, 1.0]], 1e-6)  # -w A: no token loses its gradient


def test_sapo_gate_value_and_slope():
    logprobs, old, _, adv = setup()
    loss, _ = sapo_token_loss(logprobs, old, adv, tau_pos=1.0, tau_neg=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    gate = lambda r, tau: 4 / tau * sig(tau * (r - 1))  # noqa: E731
    assert close(loss, [[-gate(r, 1.0) for r in RATIOS[0]], [gate(r, 2.0) for r in RATIOS[0]]], 1e-6)
    loss.sum().backward()  # d/dlogp = -A * 4 sig (1 - sig) * r: at r = 1 exactly the policy gradient -A
    slope = lambda r, tau: 4 * sig(tau * (r - 1)) * (1 - sig(tau * (r - 1))) * r  # noqa: E731
    assert close(logprobs.grad, [[-slope(r, 1.0) for r in RATIOS[0]], [slope(r, 2.0) for r in RATIOS[0]]], 1e-6)
    assert logprobs.grad[0, 2].item() == pytest.approx(-1.0)


def test_gspo_uses_the_geometric_mean_ratio_of_each_sequence():
    logprobs, old, _, adv = setup()
    s = 0.75 ** (1 / 3)  # (1.5 * 0.5 * 1.0) ** (1/3), inside [0.8, 1.2]
    for token_level in (False, True):
        lp = logprobs.detach().clone().requires_grad_(True)
        loss, clipped = gspo_token_loss(lp, old, adv, torch.ones(2, 3), 0.2, 0.2, token_level=token_level)
        assert close(loss, [[-s] * 3, [s] * 3], 1e-6) and not clipped.any()
        (loss.sum(-1) / 3).sum().backward()  # seq_mean over one-row sequences
        assert close(lp.grad, [[-s / 3] * 3, [s / 3] * 3], 1e-6)  # both forms: the same gradient
    # two rows of one sequence share one ratio: (0.75 * 0.75) ** (1/6) = 0.75 ** (1/3)
    loss, clipped = gspo_token_loss(logprobs, old, torch.tensor([-1.0, -1.0]), torch.ones(2, 3), seq_ids=[7, 7])
    assert close(loss, [[1 - 3e-4] * 3] * 2, 1e-6) and clipped.all()  # A < 0: s = 0.9086 clipped to 1 - 3e-4
    with pytest.raises(ValueError, match="one advantage per row"):
        gspo_token_loss(logprobs, old, torch.tensor([[1.0, -1.0, 1.0]] * 2), torch.ones(2, 3))


def test_k3_clamped_and_policy_loss_dispatch():
    lp = torch.zeros(1, 3)
    ref = torch.tensor([[30.0, -30.0, 0.5]])
    # d = 30 -> 20 -> exp(20) - 21 -> 10; d = -30 -> -20 -> exp(-20) + 19 -> 10; d = 0.5 untouched
    assert close(kl_k3_clamped(lp, ref), [[10.0, 10.0, math.exp(0.5) - 1.5]], 1e-5)
    assert kl_k3(lp, ref)[0, 1].item() == pytest.approx(29.0)
    logprobs, old, sampler, adv = setup()
    ppo, _ = policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), correction="none", clip_eps_low=0.2,
                         clip_eps_high=0.2, loss="ppo")
    dual, _ = policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), correction="none", clip_eps_low=0.2,
                          clip_eps_high=0.2, loss="dual_clip", clip_ratio_c=1.2)
    assert dual.item() == pytest.approx(ppo.item() - 0.3 / 6, abs=1e-6)
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), loss="ppo2")
    with pytest.raises(ValueError, match="unknown KL estimator"):
        policy_loss(logprobs, old, sampler, adv, torch.ones(2, 3), kl_estimator="k2")
    opts = loss_options(TrainerConfig(loss="sapo", sapo_tau_neg=2.0, kl_estimator="k3_clamp"))
    assert opts["loss"] == "sapo" and opts["sapo_tau_neg"] == 2.0 and opts["kl_estimator"] == "k3_clamp"
