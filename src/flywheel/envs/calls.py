"""Function-level grading by data: the trusted grader sends inputs, gets plain values back and compares them itself.

    status, components = grade_calls(task, base, cfg, kind="auto")   # base: a private copy of the workspace

Why: for a task whose tests are calls and comparisons (the synthetic tasks, HumanEval), nothing about the verdict
has to happen in the interpreter that runs the code under test. That process (a fresh sandbox on a copy of the
agent's workspace, `python -I`, tasks/callee.py) receives the call list on stdin: module, function and arguments,
never the expected values, and no test file is written into its tree. It sends back encoded values. This
process decodes them into fresh builtin objects (an object of the candidate's own class cannot cross: it has no
encoding) and compares each with the task's expected value under the call's rule:

* `eq`: `value == expected`, builtin equality (so `1 == True`, `[1] != (1,)`, as the original asserts said);
* `close`: numbers within `tol` of each other (HumanEval's `abs(candidate(x) - y) < 1e-6`);
* `truthy` / `falsy`: `bool(value)`.

So patching a runner, forging a report, replacing a guard, peeking at tests, shadowing builtins or returning an
always-equal object earns nothing by construction: the only way to pass a call is to return the right value.
What it does not cover: code that computes the right answer by other means than the function (a lookup table
of the inputs it was given, which it cannot fill without knowing the answers), and tests that are not plain
calls (those tasks keep the suite path, envs/reward.py).

A task carries its calls as `task.calls`: [{"id", "module", "function", "args", "expected", "compare", "tol"}],
args and expected in callee.py's encoding (tasks/datatests.py builds and checks them).
Tests: tests/unit/test_calls.py, tests/redteam/.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.sandbox.workspace import base_permissions
from flywheel.tasks import callee
from flywheel.tasks.repoenv import ready_env
from flywheel.types import Task

_SOURCE = Path(callee.__file__).read_text(encoding="utf-8")


def judge(entry: dict[str, Any], value: Any) -> bool:
    """Does `value` (decoded, plain builtins) satisfy the call's rule? Only trusted objects reach this."""
    compare = entry.get("compare", "eq")
    if compare == "truthy":
        return bool(value)
    if compare == "falsy":
        return not value
    expected = callee.decode(entry["expected"])
    if compare == "close":
        numbers = (int, float)
        if type(value) not in numbers or type(expected) not in numbers:
            return False
        return bool(math.isfinite(value) and abs(value - expected) < float(entry.get("tol", 1e-6)))
    return bool(value == expected)


def read_results(stdout: str, calls: list[dict[str, Any]]) -> tuple[dict[str, str], bool]:
    """(test id -> passed/failed/error/missing, the reply was well-formed) from the candidate's reply. A test id
    passes only when every call under it does; an unknown or repeated call index is ignored."""
    per_call = ["missing"] * len(calls)
    try:
        results = json.loads(stdout)["results"]
        assert isinstance(results, list)
    except (ValueError, KeyError, TypeError, AssertionError, RecursionError):
        results, ok = [], False
    else:
        ok = True
    for r in results:
        i = r.get("i") if isinstance(r, dict) else None
        if type(i) is not int or not 0 <= i < len(calls) or per_call[i] != "missing":
            continue
        if r.get("ok") is not True:
            per_call[i] = "error"
            continue
        try:
            value = callee.decode(r.get("value"))
        except (ValueError, TypeError, RecursionError):
            per_call[i] = "error"
            continue
        per_call[i] = "passed" if judge(calls[i], value) else "failed"
    rank = {"passed": 0, "failed": 1, "error": 2, "missing": 3}
    status: dict[str, str] = {}
    for entry, s in zip(calls, per_call):
        prev = status.get(entry["id"], "passed")
        status[entry["id"]] = s if rank[s] > rank[prev] else prev
    return status, ok


def grade_calls(task: Task, base: Path, cfg: EnvConfig, kind: str = "auto") -> tuple[dict[str, str], dict[str, float]]:
    """Run `task.calls` against `base` (a private copy of the agent's workspace that the caller owns and removes)
    in a fresh sandbox; (status per call id, components)."""
    env_dir = ready_env(task.python_env, cfg.python_envs_dir) if task.python_env is not None else None
    request = json.dumps({"calls": [{"module": c["module"], "function": c["function"],
                                     "args": c.get("args", {"tuple": []})} for c in task.calls]})
    components: dict[str, float] = {"data_verdict": 1.0}
    base_permissions(base)
    limits = SandboxLimits.for_grading(cfg)
    with create_sandbox(base, limits, kind=kind, python_env=env_dir) as sb:
        res = sb.run(f"python -I -c {shlex.quote(_SOURCE)}", timeout_s=cfg.grade_timeout_s, stdin=request)
    if res.timed_out:
        components["timed_out"] = 1.0
    status, ok = read_results(res.stdout, task.calls)
    if not ok:
        components["bad_report"] = 1.0
    return status, components
