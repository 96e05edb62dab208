"""The pool's graded groups as the online learner's samples: hand-off, advantages, and the step schedule.

    inbox = GroupInbox(max_waiting=256)          # pool.BackgroundRollouts(on_group=inbox.put) on the serving loop
    groups = inbox.drain()                       # the learner's thread: the groups that arrived since the last call
    samples = group_samples(group, "grpo")       # advantages in the rewards, for a trainer with advantage = "given"
    next_source(feedback_ready, groups_ready, contested, share)   # "feedback" | "groups" | None

Why so. One learner, one optimizer, two sources of samples: users' feedback (one sample per event, advantage
r - running baseline; online/learner.py) and the pool's sandbox-graded groups. The learner's trainer runs with
`advantage = "given"`, so each source puts its own advantage into the reward: a group's are group-relative,
computed by `trainer.advantages.compute_advantages` (GRPO or Dr.GRPO, the offline trainer's function), and the
loss, the off-policy correction (TIS by default) and the optimizer are the trainer's own. A step takes one
source's batch, never a mix: under token-mean aggregation a multi-turn rollout of hundreds of sampled tokens would
outweigh a four-token suggestion in the same batch, and the users' signal would vanish in it.

`next_source` decides which source the next step serves. It is work-conserving (a source trains alone while the
other has no full batch: rollouts keep training the policy when no user is there, and users' feedback is not held
back by an idle pool) and, while both have a batch ready, gives `share` of those contested steps to the groups —
only contested steps count, so an hour of group steps with no users does not starve users' feedback afterwards.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Sequence

from flywheel.trainer.advantages import compute_advantages
from flywheel.types import Reward, Trajectory

SOURCES = ("feedback", "groups")


def group_samples(group: Sequence[Trajectory], kind: str) -> list[Trajectory]:
    """Copies of a graded group's trajectories whose reward value is their group-relative advantage (`kind`: "grpo"
    or "drgrpo"); the raw reward stays in `components["reward"]`, flags and tests are kept."""
    if kind not in ("grpo", "drgrpo"):
        raise ValueError(f"online.pool.advantage must be 'grpo' or 'drgrpo', got {kind!r}")
    rewards = [t.graded.value for t in group]
    adv = compute_advantages(rewards, [t.group_id for t in group], kind).tolist()
    out = []
    for t, r, a in zip(group, rewards, adv):
        g = t.graded
        reward = Reward(float(a), components={**g.components, "reward": r, "advantage": float(a)}, flags=list(g.flags),
                        tests=dict(g.tests), notes=list(g.notes))
        out.append(dataclasses.replace(t, reward=reward, meta={**t.meta, "source": "pool"}))
    return out


def next_source(feedback_ready: bool, groups_ready: bool, contested: dict[str, int], share: float) -> str | None:
    """The source of the next step. `contested`: steps each source took while both were ready (the caller counts
    them); `share`: the groups' target share of those."""
    if not 0 <= share <= 1:
        raise ValueError(f"online.pool.group_step_share must be in [0, 1], got {share}")
    if feedback_ready != groups_ready:
        return "feedback" if feedback_ready else "groups"
    if not feedback_ready:
        return None
    f, g = contested.get("feedback", 0), contested.get("groups", 0)
    return "groups" if g < share * (f + g + 1) else "feedback"


class GroupInbox:
    """Graded groups from the pool (an asyncio loop) to the learner (a thread): `put` never blocks, the oldest
    beyond `max_waiting` are dropped and counted (`num_overflow`)."""

    def __init__(self, max_waiting: int):
        if max_waiting < 1:
            raise ValueError(f"online.pool.max_waiting_groups must be >= 1, got {max_waiting}")
        self.max_waiting = max_waiting
        self._groups: deque[list[Trajectory]] = deque()
        self._lock = threading.Lock()
        self.num_put = 0
        self.num_overflow = 0

    def put(self, group: Sequence[Trajectory]) -> None:
        with self._lock:
            self._groups.append(list(group))
            self.num_put += 1
            while len(self._groups) > self.max_waiting:
                self._groups.popleft()
                self.num_overflow += 1

    def drain(self) -> list[list[Trajectory]]:
        with self._lock:
            out = list(self._groups)
            self._groups.clear()
        return out
