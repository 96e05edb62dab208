"""Rollout worker: groups of G sessions per task against one engine, with a concurrency limit.

    worker = RolloutWorker(engine, chat, env_factory, cfg)
    group = await worker.run_group(task, group_size=8, group_id="step3/task17")

Why: GRPO needs G tries of the same task; running them (and many groups) at once is what lets the engine
batch decode steps. A session that breaks outside the policy (sandbox, grader or engine error) is an
*environment failure*: it is retried up to `cfg.max_env_retries` times and, if it still fails, recorded
with `env_failure` set and no reward — never a zero reward the trainer would learn from.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from flywheel.config import RolloutConfig
from flywheel.rollout.agent import EnvironmentFailure, SandboxStartFailure, run_session
from flywheel.types import Task, Trajectory


class RolloutWorker:
    def __init__(self, engine, chat, env_factory: Callable[[], object], cfg: RolloutConfig):
        self.engine = engine
        self.chat = chat
        self.env_factory = env_factory
        self.cfg = cfg
        self._slots = asyncio.Semaphore(cfg.concurrency)
        self.counters: Counter[str] = Counter()
        self.num_running = 0  # sessions between their env's creation and the end of run_session (env closed)

    async def run_one(self, task: Task, group_id: str, seed: int | None) -> Trajectory:
        last_error = ""
        for attempt in range(self.cfg.max_env_retries + 1):
            async with self._slots:
                env = self.env_factory()
                self.num_running += 1
                try:
                    traj = await run_session(self.engine, self.chat, env, task, self.cfg, group_id=group_id,
                                             seed=None if seed is None else seed + 7919 * attempt)
                    self.counters["sessions"] += 1
                    if attempt:
                        traj.meta["env_retries"] = attempt
                    return traj
                except EnvironmentFailure as err:
                    last_error = str(err)
                    self.counters["env_failures"] += 1
                    if isinstance(err, SandboxStartFailure):
                        self.counters["sandbox_start_failures"] += 1
                finally:
                    self.num_running -= 1
        self.counters["env_failed_sessions"] += 1
        return Trajectory(task_id=task.id, group_id=group_id, env_failure=last_error)

    async def run_group(self, task: Task, group_size: int | None = None, group_id: str | None = None,
                        seed: int | None = None) -> list[Trajectory]:
        g = group_size or self.cfg.group_size
        gid = group_id or task.id
        return list(await asyncio.gather(*[
            self.run_one(task, gid, None if seed is None else seed * 1000 + i) for i in range(g)]))
