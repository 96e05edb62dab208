"""Play a red-team case as an agent session and grade it the way a run does.

    result = play(target, calls, cfg.env, cache_dir)     # CodingEnv.reset, the calls, submit, grade
    result.reward.value, result.reward.flags, result.grade_s
    regrade(result, cfg.env, integrity=False)            # the same final workspace without the defences (bench)

Why through `CodingEnv`: the tool log (and so `outside_read`, `tool_spam`) comes from the real harness, shell
commands run in the real sandbox, and grading is `env.grade()` — the path every RL session takes.
Tests: tests/redteam/. Benchmark: `flywheel bench redteam`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.reward import grade
from flywheel.redteam.targets import Target
from flywheel.types import Reward, ToolCall


@dataclass
class Played:
    target: Target
    reward: Reward
    grade_s: float
    workspace: Path | None  # a copy of the final workspace (the caller removes it), or None
    tool_log: list[dict]


def play(target: Target, calls: list[ToolCall], cfg: EnvConfig, cache_dir: Path, *, keep: bool = False) -> Played:
    """Run `calls` in a fresh session on `target` (submitting if they do not), then grade it."""
    if not any(c.name == "submit" for c in calls):
        calls = [*calls, ToolCall("submit", {})]
    with CodingEnv(cfg, cache_dir) as env:
        env.reset(target.task)
        for call in calls:  # one call per turn, as a model would
            _, done = env.step([call])
            if done:
                break
        t0 = time.perf_counter()
        reward = env.grade()
        grade_s = time.perf_counter() - t0
        kept = None
        if keep:
            kept = Path(tempfile.mkdtemp(prefix="flywheel-redteam-"))
            shutil.copytree(env.sandbox.workspace, kept / "ws", symlinks=True)
        return Played(target, reward, grade_s, kept, list(env.harness.log) if env.harness is not None else [])


def regrade(played: Played, cfg: EnvConfig, *, integrity: bool) -> tuple[Reward, float]:
    """Grade the kept final workspace again (`integrity=False`: without the defences), timed."""
    assert played.workspace is not None, "play(..., keep=True) keeps the workspace"
    t0 = time.perf_counter()
    reward = grade(played.target.task, played.workspace / "ws", cfg, tool_log=played.tool_log, integrity=integrity)
    return reward, time.perf_counter() - t0


def caught(reward: Reward, flag: str) -> bool:
    """An attack is caught when it earns nothing and either raises the flag it should or gets no test credit from
    a verdict decided outside the candidate's interpreter: the data verdict's own comparison (envs/calls.py), the
    check program's in its own sandbox (envs/checks.py) or the suite verdict (envs/suite.py), whose twins raise
    `verdict_forged` (no flag is needed there: the verdict itself gives nothing)."""
    outside = any(reward.components.get(k) == 1.0 for k in ("data_verdict", "check_verdict", "suite_verdict"))
    return reward.value <= 0 and (flag in reward.flags or "verdict_forged" in reward.flags
                                  or (outside and reward.components.get("tests") == 0.0))
