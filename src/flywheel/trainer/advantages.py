"""Group-relative advantages: GRPO and Dr.GRPO, pure functions of rewards and group ids.

    adv = compute_advantages([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], "grpo")   # tensor [4]

Every session of one task (a *group*, `Trajectory.group_id`) is scored against its siblings:

* GRPO (DeepSeekMath): A_i = (r_i - mean_g) / (std_g + eps). The std is the unbiased sample std
  (Bessel's correction), as TRL and verl compute it; a group of one has no baseline and gets A = 0.
* Dr.GRPO (Liu et al., "Understanding R1-Zero-like training"): A_i = r_i - mean_g, no std division,
  which removes the question-difficulty bias. Its other half, no per-sequence length normalisation,
  is the loss aggregation `token_sum` in losses.py (set `trainer.aggregation = "token_sum"`).

`given` (A_i = r_i) is for callers whose rewards already carry their baseline: the online learner's single
samples have no group, so it subtracts a running baseline itself (online/learner.py).

A group whose rewards are all equal has A = 0 for every member under both estimators: it carries no
learning signal and only its KL term (if any) contributes.

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

ADVANTAGE_KINDS = ("grpo", "drgrpo", "given")


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


def compute_advantages(rewards, group_ids: Sequence[Hashable], kind: str = "grpo") -> torch.Tensor:
    """Dispatch on `kind` ("grpo", "drgrpo" or "given", `trainer.advantage`)."""
    if kind == "grpo":
        return grpo_advantages(rewards, group_ids)
    if kind == "drgrpo":
        return drgrpo_advantages(rewards, group_ids)
    if kind == "given":
        _group_index(group_ids, len(rewards))
        return _as_rewards(rewards).float()
    raise ValueError(f"unknown advantage estimator '{kind}'; choose one of {list(ADVANTAGE_KINDS)}")


def weight_negatives(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """`advantages` with every negative entry multiplied by `weight` (>= 0); positives unchanged."""
    if weight < 0:
        raise ValueError(f"negative_weight must be >= 0, got {weight}")
    return torch.where(advantages < 0, advantages * weight, advantages)
