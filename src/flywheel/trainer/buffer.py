"""The trajectory buffer between rollout workers and the trainer, with bounded staleness.

    buf = Buffer(max_staleness=2, drop_uniform_groups=True)
    buf.admit(group, trainer_version=5)      # -> "admitted" | "stale" | "uniform" | "env_failure"
    batch = buf.take(num_trajectories=32, trainer_version=6)   # whole groups, oldest first, or None

A group's staleness is `trainer_version - min(token versions)`: how many optimizer steps behind the
policy that produced its oldest token is. Groups staler than `max_staleness` are dropped and counted,
both at admission and again when taken (a group may age while it waits). Groups whose sessions all got
the same reward carry no GRPO signal (every advantage is 0) and are dropped when `drop_uniform_groups`
(dynamic sampling, as in DAPO). Sessions that failed outside the policy are removed from their group.
Pure bookkeeping: no I/O, no threads; the caller owns persistence. Two callers: the RL loop
(orchestrator/loop.py, versions = trainer steps) and the online learner on the pool's groups (online/learner.py,
versions = deployed versions).
"""

from __future__ import annotations

from collections import Counter, deque

from flywheel.types import Trajectory


def group_staleness(group: list[Trajectory], trainer_version: int) -> int:
    versions = [t.min_version for t in group if t.min_version >= 0]
    return trainer_version - min(versions) if versions else 0


class Buffer:
    def __init__(self, max_staleness: int, drop_uniform_groups: bool = True):
        self.max_staleness = max_staleness
        self.drop_uniform_groups = drop_uniform_groups
        self._groups: deque[list[Trajectory]] = deque()
        self._keys: dict[int, object] = {}  # id(group) -> caller's key (e.g. its index in a log)
        self.counters: Counter[str] = Counter()
        self.staleness_hist: Counter[int] = Counter()  # staleness of trained groups

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups)

    @property
    def num_groups(self) -> int:
        """Groups waiting to be trained on."""
        return len(self._groups)

    def admit(self, group: list[Trajectory], trainer_version: int, key: object = None) -> str:
        failed = [t for t in group if t.env_failure is not None or t.reward is None]
        group = [t for t in group if t.env_failure is None and t.reward is not None]
        self.counters["env_failures"] += len(failed)
        if not group:
            return "env_failure"
        self.counters["groups_seen"] += 1
        if group_staleness(group, trainer_version) > self.max_staleness:
            self.counters["dropped_stale"] += len(group)
            return "stale"
        if self.drop_uniform_groups and len({t.graded.value for t in group}) == 1:
            self.counters["dropped_uniform"] += len(group)
            return "uniform"
        self._groups.append(group)
        self._keys[id(group)] = key
        self.counters["admitted"] += len(group)
        return "admitted"

    def take(self, num_trajectories: int, trainer_version: int) -> list[Trajectory] | None:
        """Whole groups, oldest first, until at least `num_trajectories`; None if not enough yet."""
        fresh: deque[list[Trajectory]] = deque()
        for group in self._groups:
            if group_staleness(group, trainer_version) > self.max_staleness:
                self.counters["dropped_stale"] += len(group)
                self._keys.pop(id(group), None)
            else:
                fresh.append(group)
        self._groups = fresh
        if len(self) < num_trajectories:
            return None
        batch: list[Trajectory] = []
        while len(batch) < num_trajectories:
            group = self._groups.popleft()
            self._keys.pop(id(group), None)
            self.staleness_hist[group_staleness(group, trainer_version)] += 1
            batch.extend(group)
        return batch

    def waiting_keys(self) -> list[object]:
        """Keys of the groups still waiting, oldest first (a checkpoint records them)."""
        return [self._keys.get(id(g)) for g in self._groups]

    def restore(self, entries: list[tuple[object, list[Trajectory]]]) -> None:
        """Put (key, group) entries back, e.g. after a resume; they are not re-counted as admitted."""
        for key, group in entries:
            self._groups.append(group)
            self._keys[id(group)] = key
