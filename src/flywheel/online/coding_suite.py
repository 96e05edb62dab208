"""The gate's held-out coding suite: synthetic coding tasks through the agent loop and sandboxed grading.

    suite = CodingSuite(tasks, chat, env_factory(cfg.env, cache_dir), cfg.rollout, num_samples=2, seed=cfg.seed,
                        temperature=cfg.eval.temperature)
    rows = await suite.run(engine)                   # per-task rows of rollout.evaluate (n, correct, flags, ...)
    gate = Gate(cfg.online.gate, suggestion_suite, engine, coding=suite)  # gate.paired_records pairs the rows

Why so. A candidate that trained on the pool's rollouts changed how the policy codes, so the gate must see that:
the suite is the RL loop's own evaluation (`rollout.evaluate.evaluate` over a `RolloutWorker`, the harness's
tools, the sandboxed hidden tests with their integrity checks — what `flywheel eval` and the pipeline's eval
stage run), on held-out tasks the pool never trains on. Both versions run the same tasks with the same seeds
(paired); a task's score is its share of solved sessions (its pass@1), its integrity flags feed the gate's flag
monitor, and `gate.judge` applies the same sign test and mean-drop rule as to the suggestion suite. A task that
either version could not score (every session failed outside the policy) is left out of the pairing and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flywheel.config import RolloutConfig
from flywheel.rollout.evaluate import evaluate
from flywheel.rollout.worker import RolloutWorker
from flywheel.types import Task


class CodingSuite:
    """Held-out coding tasks, run through `rollout.evaluate` on whatever engine the gate passes in."""

    def __init__(self, tasks: Sequence[Task], chat: Any, env_factory: Callable[[], object], rollout_cfg: RolloutConfig,
                 num_samples: int, seed: int, temperature: float):
        if not tasks:
            raise ValueError("the coding suite needs at least one held-out task (online.gate.coding_num_tasks >= 1)")
        if num_samples < 1:
            raise ValueError(f"online.gate.coding_num_samples must be >= 1, got {num_samples}")
        self.tasks, self.chat, self.env_factory = list(tasks), chat, env_factory
        self.rollout_cfg = rollout_cfg.model_copy(update={"temperature": temperature})
        self.num_samples, self.seed = num_samples, seed

    async def run(self, engine: Any) -> list[dict]:
        """One pass over the tasks on `engine`'s current weights: `rollout.evaluate`'s per-task rows."""
        worker = RolloutWorker(engine, self.chat, self.env_factory, self.rollout_cfg)
        result = await evaluate(worker, self.tasks, num_samples=self.num_samples, ks=(1,), seed=self.seed)
        return result.per_task
