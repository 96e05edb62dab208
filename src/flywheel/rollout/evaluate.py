"""Evaluation: pass@1 and pass@k over a task set, with per-task results.

    result = await evaluate(worker, tasks, num_samples=4, ks=(1, 4), on_done=progress_cb)
    result.pass_at[1], result.per_task[0]

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c pass,
pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks. A task passes a sample when its reward
components say every hidden test passed (`tests == 1.0`), whatever the anti-cheat penalty, and (under
`env.require_submit`) the session submitted.
Sessions that failed outside the policy are excluded from n and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from math import comb, sqrt

from flywheel.types import Task, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c correct) is correct."""
    if n <= 0 or k <= 0:
        raise ValueError(f"pass@k needs n > 0 and k > 0 (got n={n}, k={k})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task (got {n})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def paired_difference(a: list[dict], b: list[dict]) -> tuple[float, float, int]:
    """Mean per-task pass@1 of `a` minus `b` over the tasks both scored, its standard error, and that count.

    Two policies evaluated on the same tasks differ less than two independent samples would: a task's
    difficulty cancels out. The paired standard error (std of the per-task differences / sqrt(tasks)) is
    the resolution of a before/after or sync/async comparison; a gap well inside 2 SE is noise.
    """
    rate_b = {r["task_id"]: r["correct"] / r["n"] for r in b if r["n"]}
    diffs = [r["correct"] / r["n"] - rate_b[r["task_id"]] for r in a if r["n"] and r["task_id"] in rate_b]
    m = len(diffs)
    if m == 0:
        raise ValueError("paired_difference: the two evaluations share no scored task")
    mean = sum(diffs) / m
    var = sum((d - mean) ** 2 for d in diffs) / (m - 1) if m > 1 else 0.0
    return mean, sqrt(var / m), m


def solved(traj: Trajectory) -> bool:
    r = traj.reward
    return r is not None and not r.components.get("not_submitted") and r.components.get("tests", r.value) >= 1.0


@dataclass
class EvalResult:
    pass_at: dict[int, float]
    per_task: list[dict] = field(default_factory=list)
    num_env_failures: int = 0
    mean_reward: float = 0.0


async def evaluate(worker, tasks: list[Task], num_samples: int = 1, ks: tuple[int, ...] = (1,),
                   seed: int = 0, on_done: Callable[[dict], None] | None = None) -> EvalResult:
    """Run `num_samples` sessions of every task through `worker` (a RolloutWorker) and score them."""
    ks = tuple(k for k in ks if k <= num_samples) or (1,)

    async def one(i: int, task: Task) -> dict:
        group = await worker.run_group(task, group_size=num_samples, group_id=f"eval/{task.id}", seed=seed + i)
        ok = [t for t in group if t.env_failure is None]
        c = sum(solved(t) for t in ok)
        row = {"task_id": task.id, "n": len(ok), "correct": c, "env_failures": len(group) - len(ok),
               "rewards": [t.reward.value for t in ok], "turns": [t.num_turns for t in ok],
               "flags": sorted({f for t in ok for f in t.reward.flags}), **{k: task.meta.get(k) for k in ("difficulty",)}}
        if on_done:
            on_done(row)
        return row

    rows = await asyncio.gather(*[one(i, t) for i, t in enumerate(tasks)])
    scored = [r for r in rows if r["n"] >= max(ks)]
    pass_at = {k: (sum(pass_at_k(r["n"], r["correct"], k) for r in scored) / len(scored) if scored else 0.0) for k in ks}
    rewards = [x for r in rows for x in r["rewards"]]
    return EvalResult(pass_at=pass_at, per_task=list(rows), num_env_failures=sum(r["env_failures"] for r in rows),
                      mean_reward=sum(rewards) / len(rewards) if rewards else 0.0)
