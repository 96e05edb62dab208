"""Token-level policy-gradient loss: PPO clip, off-policy correction, KL, aggregation. Pure functions.

    loss, metrics = policy_loss(logprobs, old_logprobs, sampler_logprobs, advantages, mask,
                                **loss_options(cfg.trainer))
    loss.backward()

Three policies meet in an asynchronous RL step (the "decoupled PPO" view of AReaL and prime-rl):

* pi_theta   - `logprobs`, the trainer's differentiable log-probs;
* pi_old     - `old_logprobs`, the same weights recomputed by the trainer before the update (no grad);
               the PPO ratio r = pi_theta / pi_old is clipped to [1 - eps_low, 1 + eps_high];
* mu         - `sampler_logprobs`, what the inference engine reported while sampling (possibly older
               weights, another kernel, bf16). The importance weight rho = pi_old / mu corrects for
               that; it is a constant (no gradient) applied per token:

    none     w = 1
    tis      w_t = min(rho_t, C)                            truncated IS, token level
    tis_seq  w   = min(prod_t rho_t, C)                     truncated IS, sequence level
    mis      w   = prod_t rho_t  if it is <= C, else 0      masked sequence-level IS (the sequence is dropped)
    icepop   w_t = rho_t if alpha <= rho_t <= beta, else 0  IcePop: out-of-band tokens are masked

Per-token loss: l_t = w_t * -min(r_t A, clip(r_t) A) + kl_coef * k3(pi_theta, pi_ref).
Aggregation (a coefficient per row, so micro-batches can share global denominators):

    token_mean  sum of token losses / number of loss tokens in the whole batch
    seq_mean    mean over sequences of (sum of its token losses / its loss tokens)
    token_sum   sum of token losses / (number of sequences * norm_tokens)   (Dr.GRPO: no length norm)

A "sequence" is a trajectory: rows that share a `seq_ids` value (the segments of one session) are
one sequence for sequence-level IS and for seq_mean. Every tensor is [B, T] aligned on target tokens;
`mask` is 1 where the token was sampled by the policy.
"""

from __future__ import annotations

import math
from typing import Any

import torch

CORRECTIONS = ("none", "tis", "tis_seq", "mis", "icepop")
AGGREGATIONS = ("token_mean", "seq_mean", "token_sum")


def _check_same_shape(**tensors: torch.Tensor | None) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"log-prob and mask tensors must share one [B, T] shape; got {shapes}")


def _seq_index(seq_ids: torch.Tensor | None, num_rows: int, device) -> torch.Tensor:
    """Dense 0..S-1 index per row from arbitrary integer sequence ids (default: each row its own)."""
    if seq_ids is None:
        return torch.arange(num_rows, device=device)
    seq_ids = torch.as_tensor(seq_ids, device=device).long().flatten()
    if seq_ids.numel() != num_rows:
        raise ValueError(f"seq_ids has {seq_ids.numel()} entries for {num_rows} rows; give one id per row")
    return torch.unique(seq_ids, return_inverse=True)[1]


def sequence_sums(values: torch.Tensor, mask: torch.Tensor, seq_ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (sum of masked values over its sequence, loss tokens of its sequence). [B, T] -> [B], [B]."""
    idx = _seq_index(seq_ids, values.shape[0], values.device)
    m = mask.to(values.dtype)
    num_seqs = int(idx.max()) + 1 if idx.numel() else 0
    total = torch.zeros(num_seqs, dtype=values.dtype, device=values.device).index_add_(0, idx, (values * m).sum(-1))
    count = torch.zeros(num_seqs, dtype=values.dtype, device=values.device).index_add_(0, idx, m.sum(-1))
    return total[idx], count[idx]


def correction_weights(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                       kind: str = "tis", *, cap: float = 2.0, alpha: float = 0.5, beta: float = 2.0,
                       seq_ids=None) -> tuple[torch.Tensor, dict[str, float]]:
    """Off-policy importance weights w [B, T] (float32, no grad, 0 outside `mask`) and their metrics.

    metrics: `is_weight_mean` (over loss tokens), `is_clip_frac` (tokens whose weight was truncated at
    C), `is_mask_frac` (tokens given weight 0 by MIS or IcePop).
    """
    if kind not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction '{kind}'; choose one of {list(CORRECTIONS)}")
    _check_same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, mask=mask)
    m = mask.bool()
    log_rho = (old_logprobs.detach().float() - sampler_logprobs.detach().float()).masked_fill(~m, 0.0)
    clipped = torch.zeros_like(m)
    masked = torch.zeros_like(m)
    log_c = math.log(cap)
    if kind == "none":
        w = torch.ones_like(log_rho)
    elif kind == "tis":
        clipped = log_rho > log_c
        w = log_rho.clamp(max=log_c).exp()
    elif kind == "icepop":
        masked = (log_rho < math.log(alpha)) | (log_rho > math.log(beta))
        w = log_rho.exp().masked_fill(masked, 0.0)
    else:
        seq_log_rho, _ = sequence_sums(log_rho, m, seq_ids)  # [B]
        seq_log_rho = seq_log_rho[:, None].expand_as(log_rho)
        if kind == "tis_seq":
            clipped = seq_log_rho > log_c
            w = seq_log_rho.clamp(max=log_c).exp()
        else:  # mis
            masked = seq_log_rho > log_c
            w = seq_log_rho.clamp(max=log_c).exp().masked_fill(masked, 0.0)
    w = w.masked_fill(~m, 0.0)
    n = max(int(m.sum()), 1)
    metrics = {
        "is_weight_mean": float(w.sum()) / n,
        "is_clip_frac": float((clipped & m).sum()) / n,
        "is_mask_frac": float((masked & m).sum()) / n,
    }
    return w, metrics


def ppo_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                   clip_eps_low: float = 0.2, clip_eps_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate per token, -min(r A, clip(r, 1-lo, 1+hi) A), and where the clip is active. [B, T]."""
    ratio = torch.exp(logprobs - old_logprobs.detach())
    adv = advantages.to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv[:, None]
    surr1 = ratio * adv
    surr2 = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    return -torch.minimum(surr1, surr2), surr2 < surr1


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per token: exp(d) - d - 1, d = log pi_ref - log pi."""
    d = ref_logprobs.detach() - logprobs
    return torch.exp(d) - d - 1.0


def aggregation_weights(mask: torch.Tensor, aggregation: str = "token_mean", seq_ids=None,
                        norm_tokens: int | None = None) -> torch.Tensor:
    """Coefficient per row c [B] such that loss = sum_b c_b * sum_t mask_bt * l_bt (see module doc)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation '{aggregation}'; choose one of {list(AGGREGATIONS)}")
    m = mask.float()
    _, seq_tokens = sequence_sums(m, m, seq_ids)  # loss tokens of each row's sequence
    idx = _seq_index(seq_ids, m.shape[0], m.device)
    has = torch.zeros(int(idx.max()) + 1 if idx.numel() else 0, device=m.device).index_add_(
        0, idx, (m.sum(-1) > 0).float()) > 0
    num_seqs = max(int(has.sum()), 1)
    if aggregation == "token_mean":
        return torch.full((m.shape[0],), 1.0 / max(float(m.sum()), 1.0), device=m.device)
    if aggregation == "seq_mean":
        return 1.0 / (num_seqs * seq_tokens.clamp(min=1.0))
    if norm_tokens is None or norm_tokens <= 0:
        raise ValueError("aggregation 'token_sum' needs norm_tokens > 0 (trainer.norm_tokens: the constant divisor)")
    return torch.full((m.shape[0],), 1.0 / (num_seqs * norm_tokens), device=m.device)


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, *, clip_eps_low: float = 0.2,
                clip_eps_high: float = 0.28, correction: str = "tis", tis_cap: float = 2.0,
                icepop_alpha: float = 0.5, icepop_beta: float = 2.0, aggregation: str = "token_mean",
                norm_tokens: int | None = None, ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                seq_ids=None, is_weights: torch.Tensor | None = None,
                row_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The RL loss (a scalar with grad through `logprobs`) and its metrics (floats).

    `is_weights` [B, T] and `row_weights` [B] may be precomputed over a whole batch (the trainer does,
    so micro-batches share sequence-level weights and denominators); by default they are computed from
    the tensors given. Metrics: loss, pg_loss, kl (token mean of k3), clip_frac, ratio_mean, num_tokens,
    and the correction metrics when computed here.
    """
    _check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs,
                      mask=mask, ref_logprobs=ref_logprobs)
    if advantages.dim() == 1 and advantages.shape[0] != logprobs.shape[0]:
        raise ValueError(f"advantages [{advantages.shape[0]}] must have one entry per row ({logprobs.shape[0]})")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (a reference model); set trainer.kl_coef = 0 or give one")
    m = mask.bool()
    mf = m.to(logprobs.dtype)
    metrics: dict[str, Any] = {}
    if is_weights is None:
        is_weights, is_metrics = correction_weights(old_logprobs, sampler_logprobs, m, correction, cap=tis_cap,
                                                    alpha=icepop_alpha, beta=icepop_beta, seq_ids=seq_ids)
        metrics.update(is_metrics)
    if row_weights is None:
        row_weights = aggregation_weights(m, aggregation, seq_ids, norm_tokens)
    coef = row_weights.to(logprobs.dtype)[:, None] * mf  # [B, T]
    pg, clipped = ppo_token_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    pg_loss = (coef * is_weights.to(logprobs.dtype).detach() * pg).sum()
    loss = pg_loss
    n = max(int(m.sum()), 1)
    kl_mean = 0.0
    if ref_logprobs is not None:
        kl = kl_k3(logprobs, ref_logprobs)
        if kl_coef > 0:
            loss = loss + kl_coef * (coef * kl).sum()
        kl_mean = float((kl.detach() * mf).sum()) / n
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    metrics.update({
        "loss": float(loss.detach()),
        "pg_loss": float(pg_loss.detach()),
        "kl": kl_mean,
        "clip_frac": float((clipped & m).sum()) / n,
        "ratio_mean": float((ratio * mf).sum()) / n,
        "num_tokens": int(m.sum()),
    })
    return loss, metrics


def loss_options(cfg) -> dict[str, Any]:
    """The keyword arguments of `policy_loss` taken from a TrainerConfig-like object."""
    return dict(clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high, correction=cfg.correction,
                tis_cap=cfg.tis_cap, icepop_alpha=cfg.icepop_alpha, icepop_beta=cfg.icepop_beta,
                aggregation=cfg.aggregation, norm_tokens=getattr(cfg, "norm_tokens", None), kl_coef=cfg.kl_coef)
