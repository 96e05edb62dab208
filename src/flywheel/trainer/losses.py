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

Per-token loss: l_t = w_t * surrogate_t + kl_coef * k3(pi_theta, pi_ref), the surrogate chosen by `loss`
(`trainer.loss`; r_t = pi_theta / pi_old per token, s = the sequence's geometric-mean ratio):

    ppo         -min(r A, clip(r, 1-lo, 1+hi) A)                       PPO with clip-higher (default)
    dual_clip   ppo, and for A < 0 at most clip_ratio_c * |A|           Ye et al. 2019; verl "vanilla"
    gspo        -min(s A, clip(s) A), s with its gradient               GSPO (Zheng et al. 2025), clip 3e-4/4e-4
    gspo_token  the same with s_t = sg[s] * r_t / sg[r_t]               GSPO-token; verl "gspo"
    cispo       -sg[clip(r, 1-lo, 1+hi)] A log pi_theta                 CISPO (MiniMax-M1); verl "cispo"
    sapo        -(4 / tau) sigmoid(tau (r - 1)) A, tau by sign of A    SAPO (Qwen); verl "sapo", TRL "sapo"

Each is checked against the peer's own code in tests/unit/test_peer_objectives.py.
Aggregation (a coefficient per row, so micro-batches can share global denominators):

    token_mean  sum of token losses / number of loss tokens in the whole batch
    seq_mean    mean over sequences of (sum of its token losses / its loss tokens)
    token_sum   sum of token losses / (number of sequences * norm_tokens)   (Dr.GRPO: no length norm;
                verl "seq-mean-token-sum-norm" with loss_scale_factor = norm_tokens)

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
LOSSES = ("ppo", "dual_clip", "gspo", "gspo_token", "cispo", "sapo")
KL_ESTIMATORS = ("k3", "k3_clamp")
GSPO_MAX_LOG_RATIO = 10.0  # verl's clamp of the GSPO log-ratio: exp(10) is far outside any clip, and finite


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


def kl_k3_clamped(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, max_log_ratio: float = 20.0,
                  max_kl: float = 10.0) -> torch.Tensor:
    """k3 with verl's guards (`kl_penalty(..., "low_var_kl")` in verl/trainer/ppo/core_algos.py): d clamped to
    [-max_log_ratio, max_log_ratio] before exp, the estimate to [-max_kl, max_kl]. Why: one token whose reference
    log-prob is far below the policy's makes exp(d) overflow the KL term (and its gradient) of the whole batch;
    clamped tokens get no gradient. [B, T]."""
    d = (ref_logprobs.detach() - logprobs).clamp(-max_log_ratio, max_log_ratio)
    return (torch.exp(d) - d - 1.0).clamp(-max_kl, max_kl)


def _row_advantages(advantages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    adv = advantages.to(dtype)
    return adv[:, None] if adv.dim() == 1 else adv


def dual_clip_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                         clip_eps_low: float = 0.2, clip_eps_high: float = 0.28,
                         clip_ratio_c: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (Ye et al. 2019, "Mastering complex control in MOBA games", arXiv:1912.09729) per token.

    The PPO loss, and for A < 0 its value is at most clip_ratio_c * |A| = -clip_ratio_c * A: a token whose ratio
    has grown far above 1 while its advantage is negative (a stale or off-policy sample) would otherwise push with
    an unbounded -r A. Where the bound holds the gradient is 0. verl's `compute_policy_loss_vanilla` (clip_ratio_c,
    default 3.0, must be > 1). Returns (loss, where either clip is active). [B, T]."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (the dual clip bounds ratios above 1); got {clip_ratio_c}")
    pg, clipped = ppo_token_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    adv = _row_advantages(advantages, logprobs.dtype)
    bound = -clip_ratio_c * adv
    lower = (adv < 0) & (pg > bound)
    return torch.where(adv < 0, torch.minimum(pg, bound), pg), clipped | lower


def gspo_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_eps_low: float = 3e-4, clip_eps_high: float = 4e-4, seq_ids=None,
                    token_level: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071) per token.

    The importance ratio is the sequence's: s = exp(mean over its loss tokens of log r_t), the geometric mean of
    the token ratios (length-normalised so that s stays near 1 whatever the length), clipped per sequence to
    [1 - lo, 1 + hi] (the paper: 3e-4 / 4e-4); every token of the sequence carries -min(s A, clip(s) A).

    * token_level=False (`gspo`): s keeps its gradient, d s / d log pi_t = s / |y|.
    * token_level=True (`gspo_token`, the paper's GSPO-token; verl's `compute_policy_loss_gspo`):
      s_t = sg[s] * pi_t / sg[pi_t], equal to s in value, gradient s per token, so each token may carry its own
      advantage. With one advantage per sequence both give the same loss and the same gradient under every
      aggregation (the aggregation coefficient is constant within a sequence); `seq_mean` is the paper's
      sequence-mean objective (TRL: importance_sampling_level="sequence", loss_type="grpo").

    A sequence is the rows sharing a `seq_ids` value that are given here: the trainer calls this per
    micro-batch, so a trajectory whose segments land in different micro-batches gets one ratio per part (in value
    1 on the first epoch, where pi_theta = pi_old). The log-ratio is clamped at GSPO_MAX_LOG_RATIO as verl does.
    `gspo` needs one advantage per row (a [B] tensor or a [B, T] one constant along each row's loss tokens).
    Returns (loss, where the clip is active). [B, T]."""
    m = mask.bool()
    adv = _row_advantages(advantages, logprobs.dtype)
    if not token_level and adv.shape[-1] > 1:
        a = adv.expand_as(logprobs)
        spread = (a.masked_fill(~m, -math.inf).amax(-1) - a.masked_fill(~m, math.inf).amin(-1)).nan_to_num(0.0)
        if bool((spread.masked_fill(~m.any(-1), 0.0) > 1e-6).any()):
            raise ValueError("loss 'gspo' scores whole sequences and needs one advantage per row; give a [B] tensor "
                             "or use loss 'gspo_token' for per-token advantages")
    log_ratio = (logprobs - old_logprobs.detach()).masked_fill(~m, 0.0)
    total, count = sequence_sums(log_ratio, m, seq_ids)  # [B], [B]
    seq_log_ratio = (total / count.clamp(min=1.0))[:, None]  # [B, 1]
    if token_level:
        log_s = logprobs - logprobs.detach() + seq_log_ratio.detach()
    else:
        log_s = seq_log_ratio.expand_as(logprobs)
    s = torch.exp(log_s.clamp(max=GSPO_MAX_LOG_RATIO))
    surr1 = s * adv
    surr2 = s.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    return -torch.minimum(surr1, surr2), surr2 < surr1


def cispo_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     clip_eps_low: float = 0.2, clip_eps_high: float = 0.28) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv:2506.13585) per token: -sg[clip(r, 1 - lo, 1 + hi)] * A * log pi_theta.

    The ratio is clipped as a constant weight instead of the update: a REINFORCE gradient (A * grad log pi) scaled
    by the clipped weight, so no token's gradient is zeroed by the clip (PPO drops the clipped tokens, often the
    rare "reflective" ones). The value carries log pi itself, as verl's `compute_policy_loss_cispo` and TRL's
    loss_type="cispo" write it. Convention: verl's (bounds 1 - lo and 1 + hi from clip_eps_*); TRL's
    `epsilon_high` is the absolute cap 1 + hi with no lower bound (MiniMax-M1 sets none: clip_eps_low = 1 here).
    Returns (loss, where the weight was clipped). [B, T]."""
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    weight = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    adv = _row_advantages(advantages, logprobs.dtype)
    return -weight * adv * logprobs, weight != ratio


def sapo_token_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[torch.Tensor, torch.Tensor]:
    """SAPO (Qwen, "Soft Adaptive Policy Optimization", arXiv:2511.20347) per token: -f(r) A with the gate
    f(r) = (4 / tau) * sigmoid(tau * (r - 1)), tau = tau_pos where A > 0, else tau_neg.

    Instead of a hard clip, the gate's slope d f / d r = 4 sigmoid'(.) is 1 at r = 1 (the policy gradient on
    policy) and decays smoothly as r leaves 1, faster for a larger tau; tau_neg > tau_pos damps negative updates,
    which the paper finds the less stable. verl's `compute_policy_loss_sapo` (tau_pos 1.0, tau_neg 1.05) and TRL's
    loss_type="sapo"; both aggregate with `seq_mean` (set trainer.aggregation = "seq_mean" to match).
    Returns (loss, no clip: all False). [B, T]."""
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0; got tau_pos={tau_pos}, tau_neg={tau_neg}")
    ratio = torch.exp(logprobs - old_logprobs.detach())
    adv = _row_advantages(advantages, logprobs.dtype)
    tau = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=ratio.dtype), torch.as_tensor(tau_neg, dtype=ratio.dtype))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * adv, torch.zeros_like(ratio, dtype=torch.bool)


def surrogate_token_loss(loss: str, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor, *, clip_eps_low: float = 0.2, clip_eps_high: float = 0.28,
                         clip_ratio_c: float = 3.0, gspo_clip_eps_low: float = 3e-4, gspo_clip_eps_high: float = 4e-4,
                         sapo_tau_pos: float = 1.0, sapo_tau_neg: float = 1.05,
                         seq_ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The surrogate named `loss` (`trainer.loss`, one of LOSSES) per token, and where its clip is active."""
    if loss == "ppo":
        return ppo_token_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    if loss == "dual_clip":
        return dual_clip_token_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high, clip_ratio_c)
    if loss in ("gspo", "gspo_token"):
        return gspo_token_loss(logprobs, old_logprobs, advantages, mask, gspo_clip_eps_low, gspo_clip_eps_high,
                               seq_ids, token_level=loss == "gspo_token")
    if loss == "cispo":
        return cispo_token_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    if loss == "sapo":
        return sapo_token_loss(logprobs, old_logprobs, advantages, sapo_tau_pos, sapo_tau_neg)
    raise ValueError(f"unknown policy loss '{loss}'; choose one of {list(LOSSES)}")


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
                row_weights: torch.Tensor | None = None, loss: str = "ppo", clip_ratio_c: float = 3.0,
                gspo_clip_eps_low: float = 3e-4, gspo_clip_eps_high: float = 4e-4, sapo_tau_pos: float = 1.0,
                sapo_tau_neg: float = 1.05, kl_estimator: str = "k3") -> tuple[torch.Tensor, dict[str, Any]]:
    """The RL loss (a scalar with grad through `logprobs`) and its metrics (floats).

    `loss` picks the surrogate (module doc; its knobs are the keywords of `surrogate_token_loss`) and
    `kl_estimator` the KL term ("k3" or "k3_clamp").

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
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator '{kl_estimator}'; choose one of {list(KL_ESTIMATORS)}")
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
    pg, clipped = surrogate_token_loss(loss, logprobs, old_logprobs, advantages, m, clip_eps_low=clip_eps_low,
                                       clip_eps_high=clip_eps_high, clip_ratio_c=clip_ratio_c,
                                       gspo_clip_eps_low=gspo_clip_eps_low, gspo_clip_eps_high=gspo_clip_eps_high,
                                       sapo_tau_pos=sapo_tau_pos, sapo_tau_neg=sapo_tau_neg, seq_ids=seq_ids)
    pg_loss = (coef * is_weights.to(logprobs.dtype).detach() * pg).sum()
    total = pg_loss
    n = max(int(m.sum()), 1)
    kl_mean = 0.0
    if ref_logprobs is not None:
        kl = kl_k3(logprobs, ref_logprobs) if kl_estimator == "k3" else kl_k3_clamped(logprobs, ref_logprobs)
        if kl_coef > 0:
            total = total + kl_coef * (coef * kl).sum()
        kl_mean = float((kl.detach() * mf).sum()) / n
    ratio = torch.exp(logprobs.detach() - old_logprobs.detach())
    metrics.update({
        "loss": float(total.detach()),
        "pg_loss": float(pg_loss.detach()),
        "kl": kl_mean,
        "clip_frac": float((clipped & m).sum()) / n,
        "ratio_mean": float((ratio * mf).sum()) / n,
        "num_tokens": int(m.sum()),
    })
    return total, metrics


def objective_options(cfg) -> dict[str, Any]:
    """The surrogate and KL keywords of `policy_loss` taken from a TrainerConfig-like object (the train step's)."""
    return dict(loss=cfg.loss, clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                clip_ratio_c=cfg.clip_ratio_c, gspo_clip_eps_low=cfg.gspo_clip_eps_low,
                gspo_clip_eps_high=cfg.gspo_clip_eps_high, sapo_tau_pos=cfg.sapo_tau_pos, sapo_tau_neg=cfg.sapo_tau_neg,
                kl_estimator=cfg.kl_estimator)


def loss_options(cfg) -> dict[str, Any]:
    """The keyword arguments of `policy_loss` taken from a TrainerConfig-like object."""
    return dict(objective_options(cfg), correction=cfg.correction, tis_cap=cfg.tis_cap, icepop_alpha=cfg.icepop_alpha,
                icepop_beta=cfg.icepop_beta, aggregation=cfg.aggregation, norm_tokens=getattr(cfg, "norm_tokens", None),
                kl_coef=cfg.kl_coef)
