"""Verify tasks through the real grading path: the reference fix must earn 1 (no flag), the untouched tree less.

    results = verify_tasks(tasks, EnvConfig(grade_cache=0))      # one VerifyResult per task with a solution
    [r.task_id for r in results if not r.ok]

Why here (envs/, not tasks/): it is grading (`reward.grade`: restored tests, a fresh sandbox with the task's own
environment bound in, the guard), exactly as a run grades; `flywheel tasks check --grade`, `flywheel tasks mine
--verify` and `flywheel bench envs` all use it. A task whose environment is not built is a failed verification with
the reason, never an exception.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flywheel.config import EnvConfig
from flywheel.envs.reward import grade
from flywheel.tasks.loaders import task_base_dir, write_files
from flywheel.types import Task


@dataclass
class VerifyResult:
    task_id: str
    solved: float  # reward of the reference fix
    untouched: float  # reward of the task's own (bugged) tree
    flags: list[str]
    grade_s: float  # seconds of the reference fix's grading
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.solved == 1.0 and not self.flags and self.untouched < 1.0


def verify_task(task: Task, cfg: EnvConfig, root: Path, kind: str = "auto") -> VerifyResult:
    """Grade `task`'s solution and its untouched workspace under `root` (a scratch directory)."""
    if not task.solution:
        return VerifyResult(task.id, 0.0, 0.0, [], 0.0, error="no solution")
    try:
        rewards, seconds = {}, 0.0
        for solved in (False, True):
            ws = root / "ws"
            shutil.rmtree(ws, ignore_errors=True)
            shutil.copytree(task_base_dir(task, root / "cache"), ws, symlinks=True)
            if solved:
                write_files(ws, task.solution)
            t0 = time.perf_counter()
            rewards[solved] = grade(task, ws, cfg, kind=kind)
            seconds = time.perf_counter() - t0
        good, bad = rewards[True], rewards[False]
        return VerifyResult(task.id, good.value, bad.value, list(good.flags), seconds)
    except ValueError as err:  # EnvNotReady, a test_patch that does not apply, a missing commit
        return VerifyResult(task.id, 0.0, 0.0, [], 0.0, error=str(err))


def verify_tasks(tasks: Iterable[Task], cfg: EnvConfig, kind: str = "auto") -> list[VerifyResult]:
    root = Path(tempfile.mkdtemp(prefix="flywheel-verify-"))
    try:
        return [verify_task(t, cfg, root, kind) for t in tasks]
    finally:
        shutil.rmtree(root, ignore_errors=True)
