"""Mine real-code bug-fix tasks (SWE-smith style): inject bugs into a real project, keep those its tests catch.

    tasks, report = mine_project("inflection==0.5.1", cache_dir, envs_dir, max_tasks=60, seed=0)
    flywheel tasks mine --projects inflection==0.5.1,toolz==0.12.1 --out mined.jsonl [--verify]

For each project: its source distribution becomes a git repository (sources.py); its environment is built from its
own metadata (tasks/repoenv.py); its test suite runs once on the original (the baseline: tests that pass there are
the only ones that can count); then each candidate bug (bugs.py: AST mutations of real functions, blanked bodies)
is written into a scratch copy and the suite runs again with the environment's Python. A bug is kept when at least
one baseline-passing test now fails (FAIL_TO_PASS) and the run finished in time; the baseline-passing tests that
still pass are PASS_TO_PASS. The bugged tree is committed (`refs/flywheel/<task id>`), the reference solution is the
original file, and the problem statement lists the failing tests and their failure lines, never the fix.

The mining runs are plain subprocesses in a scratch directory (not sandboxes) under the environment's Python, with
pytest's plugin autoload off as at grading. Each (and every install, download and git command) goes through
`sandbox.bounded.run_bounded`: a wall-clock limit and an address-space limit from `MineConfig` (`[mine]`), and its
whole process group killed on timeout, on interrupt, after it exits, and when flywheel itself dies. A candidate whose
run times out is rejected with reason `timeout` (`MineReport.rejected`, `MineReport.timeouts`) and mining goes on;
so is one whose commit fails (reason `error`); `flywheel tasks mine --verify` and `flywheel bench envs` then grade
every kept task through the real grading path (envs/reward.py: restored tests, sandbox, guard): the reference fix
must earn 1 and the bugged tree 0. Tests whose ids hold whitespace are left out of both lists (a printed log cannot
name them exactly).
"""

from __future__ import annotations

import difflib
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.config.mine import MineConfig
from flywheel.sandbox.bounded import run_bounded
from flywheel.tasks.mine.bugs import Bug, candidate_bugs, is_source_module
from flywheel.tasks.mine.sources import Project, commit_change, fetch_sdist, git, import_project
from flywheel.tasks.repoenv import EnvBuild, build_env, spec_from_dir
from flywheel.tasks.testlogs import parse_pytest
from flywheel.types import Task

RUN_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8",
           "COLUMNS": "240"}  # pytest cuts summary lines to the terminal width
MAX_STATEMENT_TESTS = 5


@dataclass
class MineReport:
    project: str
    env: EnvBuild | None = None
    baseline_passed: int = 0
    baseline_s: float = 0.0
    tried: int = 0
    kept: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [tried, kept]
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> candidates (no_failing_test, timeout, ...)
    timeouts: list[str] = field(default_factory=list)  # `path:function (kind)` of each candidate that timed out
    time_limited: bool = False  # stopped trying candidates at `time_limit_s` (what was kept is kept)
    interrupted: bool = False  # stopped by Ctrl-C (KeyboardInterrupt); what was kept before it is returned
    error: str = ""
    mine_s: float = 0.0


def run_suite(root: Path, python_env: Path, test_command: str, timeout_s: float, memory_mb: int | None = None,
              extra_env: dict[str, str] | None = None) -> tuple[dict[str, str], str, bool]:
    """(test id -> status, output, timed out) of the project's suite in `root` with the environment's Python.
    The run and everything it starts are killed past `timeout_s` and limited to `memory_mb` of address space."""
    env = {**os.environ, **RUN_ENV, "PATH": f"{python_env}/bin:{os.environ.get('PATH', '')}",
           "VIRTUAL_ENV": str(python_env), **(extra_env or {})}
    env.pop("PYTHONPATH", None)
    r = run_bounded(f"{test_command} -p no:cacheprovider", cwd=root, env=env, timeout_s=timeout_s,
                    memory_mb=memory_mb)
    if r.timed_out:
        return {}, r.stdout + r.stderr, True
    return parse_pytest(r.stdout), r.stdout + r.stderr, False


def failure_lines(output: str, test_ids: list[str]) -> dict[str, str]:
    """The short-summary message of each failing test (`FAILED id - AssertionError: ...`), cut to one line."""
    out = {}
    wanted = set(test_ids)
    for line in output.splitlines():
        for word in ("FAILED ", "ERROR "):
            if line.startswith(word):
                tid, _, msg = line[len(word):].partition(" - ")
                if tid.strip() in wanted:
                    out[tid.strip()] = msg.strip()[:200]
    return out


def problem_statement(project: str, f2p: list[str], messages: dict[str, str]) -> str:
    """What a user would report: the failing tests and how they fail; nothing about where the bug is."""
    lines = [f"Some tests of {project} fail after a recent change to the library code:"]
    for tid in f2p[:MAX_STATEMENT_TESTS]:
        msg = messages.get(tid, "")
        lines.append(f"- `{tid}`" + (f": {msg}" if msg else ""))
    if len(f2p) > MAX_STATEMENT_TESTS:
        lines.append(f"- and {len(f2p) - MAX_STATEMENT_TESTS} more")
    lines.append("Fix the library so that these tests pass again, without changing the tests.")
    return "\n".join(lines)


def _patch(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def _source_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__", "build", "dist"))
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if is_source_module(rel):
                out.append(rel)
    return out


def _task_from(project: Project, bug: Bug, n: int, f2p: list[str], p2p: list[str], messages: dict[str, str],
               spec: dict[str, Any], commit: str, ref: str) -> Task:
    return Task(
        id=ref, problem=problem_statement(project.name, f2p, messages), repo=project.repo, commit=commit,
        fail_to_pass=f2p, pass_to_pass=p2p, test_command=project.test_command,
        solution={bug.path: bug.old_text}, python_env=spec,
        meta={"format": "mined", "project": project.name, "path": bug.path, "function": bug.function,
              "mutation": bug.kind, "line": bug.line, "patch": _patch(bug.path, bug.new_text, bug.old_text),
              "difficulty": "hard" if bug.kind == "blank_body" else "medium"})


def _try_candidate(project: Project, bug: Bug, root: Path, env_path: Path, passing: list[str], timeout: float,
                   cfg: MineConfig, max_f2p: int, name: str, tasks: list[Task], spec: dict[str, Any]) -> str:
    """Run the suite with `bug` written into `root`; append the task when the suite catches it. Returns "" when
    kept, else the reason it is rejected (`timeout`, `no_failing_test`, `too_many_failing`, `error`)."""
    target = root / bug.path
    target.write_text(bug.new_text, encoding="utf-8")
    try:
        now, out, timed_out = run_suite(root, env_path, project.test_command, timeout, cfg.test_memory_mb)
    finally:
        target.write_text(bug.old_text, encoding="utf-8")
    if timed_out:
        return "timeout"
    f2p = [t for t in passing if now.get(t) != "passed"]
    p2p = [t for t in passing if now.get(t) == "passed"]
    if not f2p:
        return "no_failing_test"
    if len(f2p) > max_f2p:
        return "too_many_failing"
    n = len(tasks)
    ref = f"{name}.{bug.kind}.{bug.function}.{n}".replace("/", "_")
    try:
        commit = commit_change(project, bug.path, bug.new_text, ref, f"{ref}: injected {bug.kind}",
                               timeout_s=cfg.git_timeout_s)
    except ValueError:
        return "error"
    tasks.append(_task_from(project, bug, n, f2p, p2p, failure_lines(out, f2p), spec, commit, ref))
    return ""


def mine_directory(name: str, src: Path, cache_dir: str | Path, envs_dir: str | Path | None, *, max_tasks: int = 50,
                   max_tries: int | None = None, seed: int = 0, max_f2p: int = 50, limits: MineConfig | None = None,
                   time_limit_s: float | None = None) -> tuple[list[Task], MineReport]:
    """Mine a project already on disk (an unpacked sdist or any tree with its tests); see the module docstring.
    `limits`: timeouts and memory limits of every command (default: `MineConfig()`); `time_limit_s`: no candidate
    is started after this many seconds from the call (a budget for benchmarks; None = no limit)."""
    t0 = time.perf_counter()
    cfg = limits if limits is not None else MineConfig()
    report = MineReport(project=name)
    cache = Path(cache_dir)
    try:  # a project that cannot be read is reported and skipped: the other projects of the run go on
        project = import_project(src, cache / "repos", name, timeout_s=cfg.git_timeout_s)
        spec = spec_from_dir(project.repo, name=name.rsplit("-", 1)[0])
    except ValueError as err:
        report.error = f"cannot import the project: {err}"
        report.mine_s = time.perf_counter() - t0
        return [], report
    report.env = build_env(spec, envs_dir, timeout_s=cfg.install_timeout_s, memory_mb=cfg.install_memory_mb)
    if report.env.status == "failed":
        report.error = f"environment build failed: {report.env.error[-400:]}"
        return [], report
    env_path = Path(report.env.path)
    work = Path(tempfile.mkdtemp(prefix=f"flywheel-mine-{name}-"))
    tasks: list[Task] = []
    try:
        shutil.copytree(project.repo, work / "tree", ignore=shutil.ignore_patterns(".git"))
        root = work / "tree"
        b0 = time.perf_counter()
        base, out, timed_out = run_suite(root, env_path, project.test_command, cfg.baseline_timeout_s,
                                         cfg.test_memory_mb)
        report.baseline_s = time.perf_counter() - b0
        passing = sorted(t for t, s in base.items() if s == "passed" and not any(c.isspace() for c in t))
        report.baseline_passed = len(passing)
        if timed_out:
            report.error = (f"the test suite did not finish on the original within {cfg.baseline_timeout_s:.0f} s "
                            f"(mine.baseline_timeout_s): {out[-400:]}")
            return [], report
        if not passing:
            report.error = f"the test suite does not pass on the original: {out[-600:]}"
            return [], report
        timeout = cfg.candidate_timeout_s(report.baseline_s)
        r = random.Random(f"{seed}:{name}")
        bugs: list[Bug] = []
        for rel in _source_files(root):
            bugs += candidate_bugs(rel, (root / rel).read_text(encoding="utf-8", errors="replace"), r)
        r.shuffle(bugs)
        seen_functions: dict[str, int] = {}
        budget = max_tries if max_tries is not None else max(4 * max_tasks, 20)
        for bug in bugs:
            if len(tasks) >= max_tasks or report.tried >= budget:
                break
            if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
                report.time_limited = True
                break
            key = f"{bug.path}:{bug.function}"
            if seen_functions.get(key, 0) >= 2:  # spread the tasks over the project's functions
                continue
            report.tried += 1
            counts = report.by_kind.setdefault(bug.kind, [0, 0])
            counts[0] += 1
            try:
                reason = _try_candidate(project, bug, root, env_path, passing, timeout, cfg, max_f2p, name, tasks,
                                        spec)
            except KeyboardInterrupt:  # the candidate's commands are already killed (bounded.py); keep the rest
                report.interrupted = True
                break
            if reason:
                report.rejected[reason] = report.rejected.get(reason, 0) + 1
                if reason == "timeout":
                    report.timeouts.append(f"{key} ({bug.kind})")
                continue
            seen_functions[key] = seen_functions.get(key, 0) + 1
            counts[1] += 1
            report.kept += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        report.mine_s = time.perf_counter() - t0
    return tasks, report


def mine_project(pin: str, cache_dir: str | Path, envs_dir: str | Path | None = None, **kwargs: Any
                 ) -> tuple[list[Task], MineReport]:
    """Mine the source distribution `NAME==VERSION` from the package index (see `mine_directory`)."""
    limits = kwargs.get("limits") or MineConfig()
    try:
        src = fetch_sdist(pin, Path(cache_dir), timeout_s=limits.download_timeout_s)
    except ValueError as err:
        return [], MineReport(project=pin, error=str(err))
    return mine_directory(pin.replace("==", "-"), src, cache_dir, envs_dir, **kwargs)


def reset_refs(project_repo: str | Path) -> None:
    """Forget every mined task of a project repository (keeps the original)."""
    for ref in git(project_repo, "for-each-ref", "--format=%(refname)", "refs/flywheel/").split():
        if ref != "refs/flywheel/original":
            git(project_repo, "update-ref", "-d", ref)
