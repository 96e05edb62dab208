"""The engine-side pool that spreads gradings over grader actors (Ray backend).

    pool = GraderPool([handle, ...], fallback=RebuildGrader(cfg.env, cache_dir))    # engine -> grader actors
    env = CodingEnv(cfg.env, cache_dir, grader=pool)                                # CodingEnv.grade uses it

What travels is the agent's changes (envs/changes.py), not a directory.

Retry rule (GraderPool): each grading goes to the least-loaded live grader (ties: round robin). A grader that
dies (`RayActorError`) or does not answer within `timeout_s` is marked down for `down_s` and the grading is
sent to another (`rollout/grader_retries`); when none is left the engine grades in-process with `fallback`
(`rollout/graded_fallback`). A session is never lost to a grader. An error raised *by* the grading (a broken
task) is not a grader failure: it propagates exactly as the in-process `reward.grade` would raise it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from flywheel.envs.changes import Changes, Grader, call_grader
from flywheel.types import Reward, Task


class GraderPool:
    """Engine side of the grader actors: least-loaded dispatch, retry on a dead grader, in-process fallback.

    `handles` are Ray actor handles of `ray_actors.GraderActor` (anything with `.grade.remote(...)` returning a
    ref that `ray.get` resolves). Thread-safe: CodingEnv.grade runs in the agent loop's worker threads."""

    def __init__(self, handles: list, fallback: Grader, *, timeout_s: float = 600.0, down_s: float = 30.0,
                 ray_module: Any = None) -> None:
        if timeout_s <= 0 or down_s < 0:
            raise ValueError(f"timeout_s must be > 0 and down_s >= 0 (got {timeout_s}, {down_s})")
        self.handles = list(handles)
        self.fallback = fallback
        self.timeout_s, self.down_s = timeout_s, down_s
        self._ray = ray_module
        self._lock = threading.Lock()
        self._load = [0] * len(self.handles)  # gradings this engine has in flight on each grader
        self._down_until = [0.0] * len(self.handles)
        self._cursor = 0
        self.counters: Counter[str] = Counter()

    def _pick(self, tried: set[int]) -> int | None:
        now = time.monotonic()
        with self._lock:
            live = [i for i in range(len(self.handles)) if i not in tried and self._down_until[i] <= now]
            if not live:
                return None
            n = len(self.handles)
            i = min(live, key=lambda i: (self._load[i], (i - self._cursor) % n))  # least loaded, then round robin
            self._cursor = (i + 1) % n
            self._load[i] += 1
            return i

    def grade(self, task: Task, changes: Changes, tool_log: list[dict]) -> Reward:
        ray = self._ray or __import__("ray")
        tried: set[int] = set()
        while (i := self._pick(tried)) is not None:
            tried.add(i)
            ref = None
            try:
                ref = self.handles[i].grade.remote(task, changes, list(tool_log))
                reward = ray.get(ref, timeout=self.timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
                if isinstance(err, ray.exceptions.GetTimeoutError) and ref is not None:
                    try:
                        ray.cancel(ref, force=False)
                    except Exception:  # noqa: BLE001 (best effort; the grader may be gone)
                        pass
                with self._lock:
                    self._down_until[i] = time.monotonic() + self.down_s
                    self.counters["grader_retries"] += 1
                continue
            finally:
                with self._lock:
                    self._load[i] -= 1
            with self._lock:
                self.counters["graded_remote"] += 1
            return reward
        with self._lock:
            self.counters["graded_fallback"] += 1
        return call_grader(self.fallback, task, changes, tool_log)

    __call__ = grade

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        with self._lock:
            s = {f"rollout/{k}": float(self.counters.get(k, 0))
                 for k in ("graded_remote", "grader_retries", "graded_fallback")}
            s["rollout/graders_up"] = float(sum(t <= now for t in self._down_until))
        return s
