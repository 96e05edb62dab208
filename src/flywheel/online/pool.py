"""One engine pool for users and training: simulated RL rollouts on the serving engine's left-over capacity.

    flywheel serve configs/online.toml --online.pool.rollouts=true      # status: GET /v1/flywheel/status -> "pool"
    pool = BackgroundRollouts(engine, chat, env_factory(cfg.env, cache), tasks, cfg.rollout, cfg.online.pool, log)
    task = asyncio.ensure_future(pool.run(stop))                         # beside the HTTP handlers, on their loop

Why this shape: the rollouts are the RL loop's own — `RolloutWorker.run_group` over the synthetic tasks, the agent
loop (`rollout/agent.py`) and the sandboxed grading of `envs/` — and only the engine they call differs: a
`BackgroundEngine` view that sends every request at "background" priority, so the engine admits users' requests
first and keeps `max_background_rows` of the batch for them (inference/scheduler.py). Nothing in the rollout code
knows it shares an engine. Each graded group is appended to `<run_dir>/pool/trajectories.jsonl` in the RL loop's
`admitted.jsonl` format ({"index", "group"}; `orchestrator.loop.AdmittedLog` reads it), token-exact with the
weight version of every token, and handed to `on_group` — with online.pool.train, the online learner's inbox
(online/groups.py), so the learner trains on it (online/learner.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from flywheel.config import RolloutConfig
from flywheel.config.online import PoolConfig
from flywheel.inference.local import LocalEngine
from flywheel.rollout.worker import RolloutWorker
from flywheel.types import Generation, SamplingParams, Task, Trajectory


class BackgroundEngine:
    """The Engine protocol over a LocalEngine, every request at background priority (weights are the engine's)."""

    def __init__(self, engine: LocalEngine):
        self.engine = engine

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        return await self.engine.generate(prompt_ids, sampling, priority="background")

    def update_weights(self, version: int, tensors) -> float:
        return self.engine.update_weights(version, tensors)

    def pause(self) -> None:
        self.engine.pause()

    def resume(self) -> None:
        self.engine.resume()


class GroupLog:
    """Append-only JSONL of graded groups, one line each, flushed per line (a torn last line is skipped by readers)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.count = sum(1 for _ in path.open()) if path.exists() else 0
        self._file = path.open("a")

    def append(self, group: Sequence[Trajectory]) -> None:
        self._file.write(json.dumps({"index": self.count, "group": [t.to_dict() for t in group]}) + "\n")
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        self._file.close()


class BackgroundRollouts:
    """Keeps `cfg.groups_in_flight` rollout groups running on the shared engine until stopped; counts them."""

    def __init__(self, engine: LocalEngine, chat, env_factory: Callable[[], object], tasks: Sequence[Task],
                 rollout_cfg: RolloutConfig, cfg: PoolConfig, log_path: Path | None = None, seed: int = 0,
                 on_group: Callable[[list[Trajectory]], None] | None = None):
        if not tasks:
            raise ValueError("background rollouts need at least one task (online.pool.num_tasks >= 1)")
        self.engine = engine
        self.worker = RolloutWorker(BackgroundEngine(engine), chat, env_factory, rollout_cfg)
        self.tasks = list(tasks)
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.log = GroupLog(log_path) if log_path is not None else None
        self.on_group = on_group  # called with each graded group (must not block: it runs on the serving loop)
        self.t_start = time.monotonic()
        self.num_groups = 0
        self.num_trajectories = 0
        self.num_failed_groups = 0
        self.num_sampled_tokens = 0
        self.rewards: list[float] = []
        self.finished_s: deque[float] = deque(maxlen=100_000)  # monotonic end of each graded trajectory

    async def _group(self, index: int) -> list[Trajectory]:
        task = self.tasks[self.rng.randrange(len(self.tasks))]
        return await self.worker.run_group(task, group_id=f"pool/g{index}/{task.id}",
                                           seed=self.rng.randrange(1 << 30))

    def _record(self, group: list[Trajectory]) -> None:
        now = time.monotonic()
        self.num_groups += 1
        for t in group:
            if t.reward is None:  # an environment failure: no reward, never trained on
                continue
            self.num_trajectories += 1
            self.rewards.append(t.reward.value)
            self.num_sampled_tokens += int(t.meta.get("num_sampled_tokens", 0))
            self.finished_s.append(now)
        if self.log is not None:
            self.log.append(group)
        if self.on_group is not None:
            self.on_group(group)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: start groups up to `groups_in_flight`, record each as it ends. A failing group is
        counted and reported, never the end of serving."""
        in_flight: set[asyncio.Task] = set()
        started = 0
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                while len(in_flight) < self.cfg.groups_in_flight:
                    in_flight.add(asyncio.ensure_future(self._group(started)))
                    started += 1
                done, _ = await asyncio.wait({*in_flight, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for fut in done - {stopping}:
                    in_flight.discard(fut)
                    try:
                        self._record(fut.result())
                    except Exception:  # noqa: BLE001 - a broken group must not stop serving
                        self.num_failed_groups += 1
                        print(f"flywheel serve: a background rollout group failed:\n{traceback.format_exc()}",
                              file=sys.stderr, flush=True)
        finally:
            stopping.cancel()
            for fut in in_flight:
                fut.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            if self.log is not None:
                self.log.close()

    def stats(self, window_s: float = 60.0) -> dict:
        """Counts since start, the mean reward, rollouts per minute overall and over the last `window_s`."""
        now = time.monotonic()
        elapsed = max(now - self.t_start, 1e-9)
        recent = sum(1 for t in self.finished_s if t >= now - window_s)
        return {"groups": self.num_groups, "trajectories": self.num_trajectories,
                "failed_groups": self.num_failed_groups, "sampled_tokens": self.num_sampled_tokens,
                "sessions_running": self.worker.num_running,
                "env_failures": int(self.worker.counters["env_failures"]),
                "mean_reward": statistics.fmean(self.rewards) if self.rewards else None,
                "rollouts_per_min": 60.0 * self.num_trajectories / elapsed,
                "rollouts_per_min_recent": 60.0 * recent / min(elapsed, window_s),
                "max_background_rows": self.engine.max_background_rows,
                "peak_background_rows": self.engine.peak_background_rows}
