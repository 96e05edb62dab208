"""Which task runs next: uniformly at random, or weighted towards the task buckets whose groups teach.

    sampler = TaskSampler(tasks, random.Random(0), bucket_key="mutation")
    i = sampler.next()                      # an index into `tasks`
    sampler.observe(i, [0.0, 1.0, 0.0, ...])  # the rewards of the group run on tasks[i]

Why: GRPO learns nothing from a group whose sessions all got one reward (every advantage is 0), and the
buffer drops such groups (buffer.py) after the engine has paid for them. With a weak base policy most of
them fail everywhere: on the demo, 2/3 of the rollouts went to uniform groups, and one of the four kinds of
synthetic bug was never once fixed by the base policy. A run rarely sees one task twice, so a per-task
filter learns nothing; but tasks come in buckets (a synthetic task's mutation kind, a repository, a
difficulty level) whose rates differ widely and are learnt within a few groups each.

How: with `bucket_key` set, a bucket b is drawn with probability proportional to n_b * r_b, where n_b is its
number of tasks and r_b = (mixed + 1) / (seen + 2) over its last `window` groups (a Laplace estimate: an
unseen bucket starts at 1/2, and equal rates give back uniform sampling over tasks); a `floor` share of
draws is spread over all buckets by size, so no bucket is ever starved and one that becomes learnable as
the policy improves is noticed. The task is then drawn uniformly within the bucket. This is online
difficulty filtering (as in DAPO's dynamic sampling, which filters after generating) moved before
generation, at the granularity the run can actually observe. Without `bucket_key` it draws uniformly.

Pure logic over a seeded `random.Random`: the same draws and observations give the same tasks.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from flywheel.types import Task, Trajectory


class TaskSampler:
    def __init__(self, tasks: Sequence[Task], rng: random.Random, bucket_key: str = "", window: int = 32,
                 floor: float = 0.1):
        if not tasks:
            raise ValueError("the task sampler needs at least one task")
        if window < 1 or not 0.0 <= floor <= 1.0:
            raise ValueError(f"task sampler: window must be >= 1 and floor in [0, 1]; got {window}, {floor}")
        if bucket_key and not any(bucket_key in t.meta for t in tasks):
            known = sorted({k for t in tasks for k in t.meta})
            raise ValueError(f"orchestrator.task_bucket_key '{bucket_key}' is not a meta field of any task; "
                             f"the tasks have {known or 'no meta fields'} (or set '' to draw uniformly)")
        self.rng, self.floor = rng, floor
        self.num_tasks = len(tasks)
        self.bucket_of: list[str] = [str(t.meta.get(bucket_key, "")) if bucket_key else "" for t in tasks]
        self.members: dict[str, list[int]] = {}
        for i, b in enumerate(self.bucket_of):
            self.members.setdefault(b, []).append(i)
        self.recent: dict[str, deque[bool]] = {b: deque(maxlen=window) for b in self.members}

    @property
    def bucketed(self) -> bool:
        """More than one bucket: draws are weighted and observations matter (else uniform over tasks)."""
        return len(self.members) > 1

    def rate(self, bucket: str) -> float:
        """Estimated chance that a group of this bucket has mixed rewards (Laplace over the recent window)."""
        seen = self.recent[bucket]
        return (sum(seen) + 1) / (len(seen) + 2)

    def shares(self) -> dict[str, float]:
        """Probability of drawing each bucket now."""
        sizes = {b: len(m) for b, m in self.members.items()}
        weighted = {b: sizes[b] * self.rate(b) for b in sizes}
        total_w = sum(weighted.values())
        return {b: self.floor * sizes[b] / self.num_tasks + (1 - self.floor) * weighted[b] / total_w for b in sizes}

    def next(self) -> int:
        if not self.bucketed:
            return self.rng.randrange(self.num_tasks)
        shares = self.shares()
        bucket = self.rng.choices(list(shares), weights=list(shares.values()))[0]
        return self.rng.choice(self.members[bucket])

    def observe(self, index: int, rewards: Sequence[float]) -> None:
        """Record one finished group of tasks[index]: did its rewards differ (a group GRPO can learn from)?"""
        if rewards:
            self.recent[self.bucket_of[index]].append(len(set(rewards)) > 1)

    def observe_group(self, index: int, group: Sequence[Trajectory]) -> None:
        """`observe` from a finished group's trajectories (without buckets there is nothing to learn)."""
        if self.bucketed:
            self.observe(index, [t.reward.value for t in group if t.reward is not None])

    def stats(self) -> dict[str, float]:
        """`tasks/share/<bucket>` for each bucket (only with buckets): where the engine's time goes now."""
        if not self.bucketed:
            return {}
        return {f"tasks/share/{b or '(none)'}": s for b, s in self.shares().items()}


def task_sampler(tasks: Sequence[Task], rng: random.Random, orchestrator_cfg) -> TaskSampler:
    """The sampler an `orchestrator` config section asks for (task_bucket_key / _window / _floor)."""
    return TaskSampler(tasks, rng, orchestrator_cfg.task_bucket_key, orchestrator_cfg.task_bucket_window,
                       orchestrator_cfg.task_bucket_floor)
