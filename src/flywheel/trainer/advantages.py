"""Advantages: GRPO, Dr.GRPO, RLOO, REINFORCE++ (with and without a group baseline); pure functions of rewards,
group ids and (for the batch-normalised ones) each trajectory's number of loss tokens.

    adv = compute_advantages([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], "grpo")   # tensor [4]
    adv = compute_advantages(rewards, group_ids, "reinforce_pp", num_tokens=[12, 7, 30, 9])

Every session of one task (a *group*, `Trajectory.group_id`) is scored against its siblings:

* GRPO (DeepSeekMath): A_i = (r_i - mean_g) / (std_g + eps). The std is the unbiased sample std
  (Bessel's correction), as TRL and verl compute it; a group of one has no baseline and gets A = 0.
* Dr.GRPO (Liu et al., "Understanding R1-Zero-like training"): A_i = r_i - mean_g, no std division,
  which removes the question-difficulty bias. Its other half, no per-sequence length normalisation,
  is the loss aggregation `token_sum` in losses.py (set `trainer.aggregation = "token_sum"`).

* RLOO (Ahmadian et al. 2024, "Back to basics", arXiv:2402.14740): A_i = r_i - mean of the *other* members
  = n/(n-1) (r_i - mean_g); verl's `compute_rloo_outcome_advantage`.
* REINFORCE++ (Hu 2025, arXiv:2501.03262): no group baseline; the rewards are whitened over the batch,
  A_i = (r_i - mean_B) / sqrt(var_B + 1e-8). REINFORCE++-baseline first subtracts the group mean, then whitens.
  The batch statistics are over loss tokens, as verl's `masked_whiten` and OpenRLHF compute them: each
  trajectory weighs its number of loss tokens (`num_tokens`; every trajectory 1 without it), the variance is
  unbiased over that many tokens (Bessel: N_tokens / (N_tokens - 1)) and 1e-8 is added to the variance, not
  the std. The outcome reward is its return at every token (discount 1, verl's default gamma).

Singleton groups: GRPO, Dr.GRPO, RLOO and REINFORCE++-baseline give a group of one A = 0 (no baseline, no
signal; REINFORCE++-baseline also leaves it out of the batch statistics). verl instead takes a singleton's
baseline as 0, so it trains on the raw reward; tests/unit/test_peer_objectives.py asserts the difference.

`given` (A_i = r_i) is for callers whose rewards already carry their baseline: the online learner's single
samples have no group, so it subtracts a running baseline itself (online/learner.py).

A group whose rewards are all equal has A = 0 for every member under both estimators: it carries no
learning signal and only its KL term (if any) contributes (under REINFORCE++ it is whitened with the batch).

`weight_negatives(adv, w)` scales the negative advantages by w (`trainer.negative_weight`): 1 is the
estimator as published, 0 keeps only the sessions that beat their group (a policy-gradient form of
rejection-sampling fine-tuning). Why: the failed sessions push down every token they sampled, correct
copies included, and a small policy whose greedy answer rests on a few exact copies loses some of them;
on the demo's strong bases weights 1 and 0.5 lowered greedy pass@1 by 3-5 points, 0 moved it +7, -1
and -4 (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

ADVANTAGE_KINDS = ("grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "given")
WHITEN_EPS = 1e-8  # added to the variance before the square root (verl's masked_whiten)


def _as_rewards(rewards) -> torch.Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if not torch.isfinite(r).all():
        raise ValueError(f"rewards must be finite numbers; got {r.tolist()}")
    return r


def _group_index(group_ids: Sequence[Hashable], n: int) -> torch.Tensor:
    if len(group_ids) != n:
        raise ValueError(f"got {n} rewards but {len(group_ids)} group ids; pass one group id per trajectory")
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)


def _group_stats(r: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element group mean, unbiased group std and group size (float64)."""
    num_groups = int(idx.max()) + 1 if idx.numel() else 0
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, idx, torch.ones_like(r))
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, idx, r)
    mean = (total / count)[idx]
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, idx, (r - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean, var.sqrt()[idx], count[idx]


def grpo_advantages(rewards, group_ids: Sequence[Hashable], eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps); float32 [N]. Singleton groups get 0."""
    r = _as_rewards(rewards)
    if r.numel() == 0:
        return torch.zeros(0)
    mean, std, count = _group_stats(r, _group_index(group_ids, r.numel()))
    adv = (r - mean) / (std + eps)
    return torch.where(count > 1, adv, torch.zeros_like(adv)).float()


def drgrpo_advantages(rewards, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """r - group mean (no std normalisation); float32 [N]. Singleton groups get 0."""
    r = _as_rewards(rewards)
    if r.numel() == 0:
        return torch.zeros(0)
    mean, _, count = _group_stats(r, _group_index(group_ids, r.numel()))
    return torch.where(count > 1, r - mean, torch.zeros_like(r)).float()


def rloo_advantages(rewards, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """r_i - mean of the group's other members (leave-one-out); float32 [N]. Singleton groups get 0."""
    r = _as_rewards(rewards)
    if r.numel() == 0:
        return torch.zeros(0)
    mean, _, count = _group_stats(r, _group_index(group_ids, r.numel()))
    adv = (r - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, torch.zeros_like(adv)).float()


def _token_weights(num_tokens, n: int) -> torch.Tensor:
    if num_tokens is None:
        return torch.ones(n, dtype=torch.float64)
    w = torch.as_tensor(num_tokens, dtype=torch.float64).flatten()
    if w.numel() != n or not bool((w >= 0).all()):
        raise ValueError(f"num_tokens must give a count >= 0 for each of the {n} trajectories; got {w.tolist()}")
    return w


def whiten(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) with weighted mean and unbiased weighted variance (the weights are token
    counts: var = sum w (x - mean)^2 / (sum w - 1)); entries of weight 0 are returned as 0. With a total weight
    of at most 1 there is no spread to estimate and every entry is 0 (verl raises there). float64 [N]."""
    total = weights.sum()
    if float(total) <= 1.0:
        return torch.zeros_like(values)
    mean = (weights * values).sum() / total
    var = (weights * (values - mean) ** 2).sum() / (total - 1.0)
    out = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    return torch.where(weights > 0, out, torch.zeros_like(out))


def reinforce_pp_advantages(rewards, group_ids: Sequence[Hashable], num_tokens=None) -> torch.Tensor:
    """REINFORCE++: the rewards whitened over the batch (token-weighted by `num_tokens`); float32 [N]."""
    r = _as_rewards(rewards)
    _group_index(group_ids, r.numel())
    return whiten(r, _token_weights(num_tokens, r.numel())).float()


def reinforce_pp_baseline_advantages(rewards, group_ids: Sequence[Hashable], num_tokens=None) -> torch.Tensor:
    """REINFORCE++-baseline: r - group mean, then whitened over the batch (token-weighted by `num_tokens`);
    singleton groups get 0 and stay out of the statistics. float32 [N]."""
    r = _as_rewards(rewards)
    if r.numel() == 0:
        return torch.zeros(0)
    mean, _, count = _group_stats(r, _group_index(group_ids, r.numel()))
    weights = torch.where(count > 1, _token_weights(num_tokens, r.numel()), torch.zeros_like(r))
    return whiten(r - mean, weights).float()


def compute_advantages(rewards, group_ids: Sequence[Hashable], kind: str = "grpo", num_tokens=None) -> torch.Tensor:
    """Dispatch on `kind` (`trainer.advantage`, one of ADVANTAGE_KINDS). `num_tokens` (loss tokens per trajectory)
    weighs the batch statistics of the REINFORCE++ estimators; the others ignore it."""
    if kind == "grpo":
        return grpo_advantages(rewards, group_ids)
    if kind == "drgrpo":
        return drgrpo_advantages(rewards, group_ids)
    if kind == "rloo":
        return rloo_advantages(rewards, group_ids)
    if kind == "reinforce_pp":
        return reinforce_pp_advantages(rewards, group_ids, num_tokens)
    if kind == "reinforce_pp_baseline":
        return reinforce_pp_baseline_advantages(rewards, group_ids, num_tokens)
    if kind == "given":
        _group_index(group_ids, len(rewards))
        return _as_rewards(rewards).float()
    raise ValueError(f"unknown advantage estimator '{kind}'; choose one of {list(ADVANTAGE_KINDS)}")


def weight_negatives(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """`advantages` with every negative entry multiplied by `weight` (>= 0); positives unchanged."""
    if weight < 0:
        raise ValueError(f"negative_weight must be >= 0, got {weight}")
    return torch.where(advantages < 0, advantages * weight, advantages)
