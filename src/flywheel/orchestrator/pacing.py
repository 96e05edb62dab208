"""Async pacing: how far rollout production may run ahead of the trainer (`orchestrator.max_ahead_batches`).

    if paced(cfg):                                     # async mode, max_ahead_batches > 0
        limit = ahead_limit(cfg, num_engines, max_groups_in_flight)  # groups started, not yet retired
        n = to_grant(limit, granted, received, waiting)  # the loop grants n more starts: source.allow(n)
    permits = Permits(paced(cfg)); permits.give(n)     # on an engine: take() before each group it starts

Why: with production that never stops, an engine faster than the trainer fills the buffer with groups that
age past `max_staleness` before the trainer reaches them. They are dropped (on the demo, 78 of 199 groups
in one run), so their sessions were generated and graded for nothing, and on a machine whose cores are
shared the CPU they took was taken from the trainer. Paced, an engine starts a group only with a permit;
the loop hands out permits so that the groups started and not yet *retired* (trained on or dropped) stay
within `limit` = the engines' groups in flight plus `max_ahead_batches` batches. So the trainer still finds
a batch waiting when its step ends, and what it trains on is fresher. This is the bounded-lag throttle of
AReaL (`max_head_offpolicyness`) and prime-rl (`async_level`), counted in groups.

Accounting, all on the trainer's side: `granted` permits so far, groups `received` from the engines, groups
`waiting` in the buffer. Retired = received − waiting, so unretired = granted − received + waiting: permits
not yet used, groups running or in transit, and groups waiting. Groups restored from a checkpoint count as
waiting. A group an engine fails to deliver gives its permit back on that engine (`Permits.give(1)`).
"""

from __future__ import annotations

import math

from flywheel.config import FlywheelConfig


def paced(cfg: FlywheelConfig) -> bool:
    """Whether engines start groups only with permits: async mode with `max_ahead_batches > 0`."""
    return cfg.orchestrator.mode == "async" and cfg.orchestrator.max_ahead_batches > 0


def ahead_limit(cfg: FlywheelConfig, num_engines: int, max_groups_in_flight: int) -> int:
    """Groups that may be started and not yet retired: every engine's groups in flight plus
    `max_ahead_batches` batches. At least one batch, so a batch can always form. `num_engines`: the engines
    up now (a Ray pool grows and shrinks)."""
    groups_per_batch = math.ceil(cfg.trainer.batch_size / cfg.rollout.group_size)
    return max(1, num_engines) * max_groups_in_flight + cfg.orchestrator.max_ahead_batches * groups_per_batch


def to_grant(limit: int, granted: int, received: int, waiting: int) -> int:
    """Permits to hand out now so that the unretired groups reach `limit` (never negative)."""
    return max(0, limit - (granted - received + waiting))


class Permits:
    """An engine's count of groups it may still start; unpaced (`paced=False`) it never runs out."""

    def __init__(self, paced: bool) -> None:
        self.paced = paced
        self.left = 0

    def take(self) -> bool:
        """Use one permit if there is one (always True unpaced)."""
        if not self.paced:
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    def give(self, n: int) -> None:
        if self.paced:
            self.left += n
