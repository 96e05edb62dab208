"""Training-inference numerics mismatch, every step: how far the trainer's log-probs are from the sampler's.

    m = mismatch_metrics(old_logprobs, sampler_logprobs, mask, tis_cap=2.0, icepop_alpha=0.5, icepop_beta=2.0)
    m["k3"], m["max_abs_diff"], m["frac_outside_0.5_2"], ...

Why every step: an inference kernel, a bf16 cast or a stale weight version all show up here first,
long before the reward collapses (see "When Speed Kills Stability", Liu et al. 2025). With
d_t = log pi_trainer(x_t) - log mu_sampler(x_t) over generated tokens (x_t sampled from mu):

    k1 = mean(-d)                 unbiased estimate of KL(mu || pi), can be negative
    k3 = mean(exp(d) - 1 - d)     low-variance, always >= 0 estimate of the same KL
    mean_abs_diff, max_abs_diff   of |d|
    frac_outside_0.5_2            tokens with ratio exp(d) outside [0.5, 2]
    frac_outside_0.2_5            ... outside [0.2, 5]
    seq_log_ratio_mean / _max_abs sum of d over each sequence (a trajectory: rows sharing seq_ids)
    tis_clip_frac                 tokens with ratio > C (truncated by token-level TIS)
    icepop_mask_frac              tokens with ratio outside [alpha, beta] (masked by IcePop)

Pure function over [B, T] tensors; returns plain floats (0.0 for a batch without generated tokens).
"""

from __future__ import annotations

import math

import torch

from flywheel.trainer.losses import sequence_sums


def mismatch_metrics(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, *,
                     tis_cap: float = 2.0, icepop_alpha: float = 0.5, icepop_beta: float = 2.0,
                     seq_ids=None) -> dict[str, float]:
    if trainer_logprobs.shape != sampler_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError(f"trainer/sampler log-probs and mask must share one [B, T] shape; got "
                         f"{tuple(trainer_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}")
    m = mask.bool()
    n = int(m.sum())
    names = ("k1", "k3", "mean_abs_diff", "max_abs_diff", "frac_outside_0.5_2", "frac_outside_0.2_5",
             "seq_log_ratio_mean", "seq_log_ratio_max_abs", "tis_clip_frac", "icepop_mask_frac")
    if n == 0:
        return {k: 0.0 for k in names}
    d_all = (trainer_logprobs.detach().double() - sampler_logprobs.detach().double()).masked_fill(~m, 0.0)
    d = d_all[m]
    ratio = d.exp()
    seq_sum, seq_tokens = sequence_sums(d_all, m, seq_ids)
    # one value per sequence: take the first row of each sequence that has loss tokens
    idx = torch.unique(torch.as_tensor(seq_ids).flatten(), return_inverse=True)[1] if seq_ids is not None \
        else torch.arange(d_all.shape[0])
    first: dict[int, int] = {}
    for row, s in enumerate(idx.tolist()):
        if seq_tokens[row] > 0:
            first.setdefault(s, row)
    seq_vals = seq_sum[list(first.values())]
    return {
        "k1": float((-d).mean()),
        "k3": float((ratio - 1 - d).mean()),
        "mean_abs_diff": float(d.abs().mean()),
        "max_abs_diff": float(d.abs().max()),
        "frac_outside_0.5_2": float(((ratio < 0.5) | (ratio > 2.0)).double().mean()),
        "frac_outside_0.2_5": float(((ratio < 0.2) | (ratio > 5.0)).double().mean()),
        "seq_log_ratio_mean": float(seq_vals.mean()),
        "seq_log_ratio_max_abs": float(seq_vals.abs().max()),
        "tis_clip_frac": float((d > math.log(tis_cap)).double().mean()),
        "icepop_mask_frac": float(((d < math.log(icepop_alpha)) | (d > math.log(icepop_beta))).double().mean()),
    }
