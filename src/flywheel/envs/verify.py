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
    verdict: str = ""  # what decided the reference fix's reward (`verdict_kind`)

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
        return VerifyResult(task.id, good.value, bad.value, list(good.flags), seconds,
                            verdict=verdict_kind(good.components))
    except ValueError as err:  # EnvNotReady, a test_patch that does not apply, a missing commit
        return VerifyResult(task.id, 0.0, 0.0, [], 0.0, error=str(err))


VERDICTS = {  # verdict_kind -> what it means, for reports
    "data": "data verdict (calls compared by the grader)",
    "check": "check verdict (the task's program in its own sandbox, calls relayed as data)",
    "suite": "suite verdict, every FAIL_TO_PASS test with a twin",
    "suite+guard": "suite verdict, some FAIL_TO_PASS tests without a twin (those also through the guard)",
    "in-process": "the guarded in-process path alone (no twin; the code under test can reach the guard)",
}


def verdict_kind(components: dict[str, float]) -> str:
    """Which path decided a reward (docs/integrity.md): "data", "check", "suite" (each FAIL_TO_PASS test drawn has
    a twin with a changed value), "suite+guard" (some have no twin, or one with a flipped truth only: they also
    pass through the guard), "in-process", or "" (tests not run)."""
    if components.get("data_verdict"):
        return "data"
    if components.get("check_verdict"):
        return "check"
    if components.get("suite_verdict"):
        return "suite+guard" if components.get("untwinned") or components.get("flip_twins") else "suite"
    return "in-process" if components.get("in_process_verdict") else ""


def verdict_summary(results: Iterable[VerifyResult]) -> str:
    """One line: how many reference fixes each path graded."""
    counts: dict[str, int] = {}
    for r in results:
        if r.verdict:
            counts[r.verdict] = counts.get(r.verdict, 0) + 1
    return "verdicts: " + (", ".join(f"{counts[k]} {VERDICTS[k]}" for k in VERDICTS if k in counts) or "none")


def verify_tasks(tasks: Iterable[Task], cfg: EnvConfig, kind: str = "auto") -> list[VerifyResult]:
    root = Path(tempfile.mkdtemp(prefix="flywheel-verify-"))
    try:
        return [verify_task(t, cfg, root, kind) for t in tasks]
    finally:
        shutil.rmtree(root, ignore_errors=True)
