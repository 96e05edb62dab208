"""Reward: hidden tests in a fresh sandbox, with a verdict that code under test cannot decide, and anti-cheat flags.

    reward = grade(task, sandbox.workspace, cfg.env, tool_log=harness.log)
    reward.value, reward.components, reward.flags, reward.tests     # tests: id -> passed/failed/error/...
    reward.notes                                                    # why an integrity flag was raised

Three verdicts, the first that applies:
* a task with `calls` (its tests as data: every synthetic task, most HumanEval problems): the data verdict
  (envs/calls.py). The candidate's process gets only the inputs; this process compares the returned values.
  A task with a `check` program instead (the other HumanEval problems): the same, except that the comparisons are
  the program's, run in a sandbox of their own that the candidate's function answers over data (envs/checks.py).
* a pytest task (repository suites: SWE-style, mined): the suite verdict (envs/suite.py). The tests run in a
  fresh sandbox, and again in twin runs where one FAIL_TO_PASS test has one expected value changed; a test that
  passes its twin run is `verdict_forged`.
* the rest (a live service, `runtests.py` tasks without calls, `env.suite_verdict = false`): in-process, as
  below, and the reward carries `components["in_process_verdict"]`.
All three run in new sandboxes on a private copy of the final workspace, and all get the flags below.

How in-process grading resists a policy that cheats (defence in depth; tests/redteam/ is the proof of what it stops):
* It never runs in the agent's sandbox. The agent's final workspace is copied; files that would shadow the
  runner or the interpreter's start-up (`sitecustomize.py`, `*.pth`, `pytest.py`, `_pytest/`, standard-library
  names beside the tests, envs/integrity.py) are deleted; every test file and pytest config the task started
  with is restored, test files and conftest.py files the agent added are deleted; then the hidden files (a
  shipped test runner among them) are written and a SWE-bench `test_patch` applied. The copy becomes the base
  of a brand-new sandbox where the test command runs with third-party plugin autoload off.
* The runner's report is not trusted on its own (envs/guard.py): each test file gets a canary that must fail
  and a wrapper that signs, with a per-grading key that no code under test can read, a proof that the real test
  body returned. A test reported passed without a proof, a canary reported passed, or a forged proof record is
  the flag `runner_tampered`: no test credit at all.
* Results are per test, from the JUnit XML. A test that is skipped, errors, or is missing from the report (the
  process died, `os._exit`, a timeout) counts as failed.
* Reward: 1 when every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0 (`partial_credit`: the fraction
  passed); minus `flag_penalties[flag]` (default `cheat_penalty`) per flag:
  `tests_edited`, `conftest_added` (conftest.py, a pytest plugin, a changed pytest config), `sys_exit`
  (exit calls added to non-test code), `outside_read` (a tool call referred to a path outside the workspace
  and the sandbox's system directories), `tool_spam` (more than `max_tool_calls` calls), the static flags of
  envs/integrity.py (`framework_patch`, `interpreter_hook`, `always_equal`, `runner_shadowed`),
  `runner_tampered` and `verdict_forged`.
* A restored tree byte-identical to one already graded in this process reuses its verdict
  (envs/grade_cache.py, `env.grade_cache`); flags and penalty are always the session's own.
* The rubric judge (envs/judge.py) is mixed in with `combine(reward, rubric, cfg)`.

The test command must be pytest-compatible (it gets `-p no:cacheprovider --junitxml=FILE` and test files, or
node ids under the suite verdict) and must run the tests in the Python process it starts (no xdist workers).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.envs import guard
from flywheel.envs.calls import grade_calls
from flywheel.envs.checks import grade_check
from flywheel.envs.grade_cache import GRADE_CACHE, result_key
from flywheel.envs.integrity import STATIC_FLAGS, sanitize, static_flags, test_dirs_of
from flywheel.envs.junit import junit_key, parse_junit, statuses_of
from flywheel.envs.startup import pytest_config_names
from flywheel.envs.suite import PYTEST_ENV, grade_suite, runs_pytest, twinnable
from flywheel.sandbox.nofollow import write_inside
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.sandbox.services import TaskServices
from flywheel.sandbox.workspace import base_permissions
from flywheel.tasks.loaders import (
    file_of_test,
    in_dirs,
    is_test_path,
    original_bytes,
    original_file,
    original_paths,
    support_dirs_of,
)
from flywheel.tasks.repoenv import ready_env
from flywheel.types import Reward, Task

FLAGS = ("tests_edited", "conftest_added", "sys_exit", "outside_read", "tool_spam", *STATIC_FLAGS, "runner_tampered",
         "verdict_forged")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache"}  # never copied to grading (changes.py captures the same)
_EXIT_RX = re.compile(r"\bsys\s*\.\s*exit\b|\bos\s*\.\s*_exit\b|\bos\s*\.\s*kill\b|(?<![\w.])(?:exit|quit)\s*\(")
_PLUGIN_RX = re.compile(r"\bpytest_plugins\b|^\s*def\s+pytest_\w+\s*\(", re.MULTILINE)


# ---------------------------------------------------------------------------------------------
# Workspace inspection


def _walk(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            if f.endswith(".pyc") or f.startswith(".fw-junit-"):
                continue
            p = Path(dirpath) / f
            if _regular_or_link(p):  # a FIFO or device would block (or worse) when read
                out[str(p.relative_to(root))] = p
    return out


def _regular_or_link(p: Path) -> bool:
    try:
        mode = os.lstat(p).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)


def _ignore_special(dirpath: str, names: list[str]) -> set[str]:
    """copytree filter: caches, and anything that is not a directory, regular file or symlink."""
    out = set()
    for n in names:
        if n in SKIP_DIRS or n.endswith(".pyc"):
            out.add(n)
            continue
        try:
            mode = os.lstat(os.path.join(dirpath, n)).st_mode
        except OSError:
            out.add(n)
            continue
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            out.add(n)
    return out


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8", errors="replace") if not p.is_symlink() else f"<symlink {os.readlink(p)}>"
    except OSError:
        return ""


@dataclass
class WorkspaceChanges:
    """Files the agent changed relative to the task's initial workspace."""

    added: dict[str, str] = field(default_factory=dict)  # path -> new text
    modified: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (old, new)
    deleted: list[str] = field(default_factory=list)


def _git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _repo_blobs(task: Task) -> dict[str, str]:
    """path -> git blob sha of the task's commit (one `git ls-tree`, not one `git show` per file)."""
    if task.repo is None or task.commit is None:
        return {}
    r = subprocess.run(["git", "-C", task.repo, "ls-tree", "-r", task.commit], capture_output=True, text=True,
                       timeout=120)
    out = {}
    for line in r.stdout.splitlines():
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            out[path] = parts[2]
    return out


def workspace_changes(task: Task, workspace: Path) -> WorkspaceChanges:
    ch = WorkspaceChanges()
    now = _walk(Path(workspace))
    blobs = _repo_blobs(task)
    for rel, p in now.items():
        new = _read(p)
        if rel in task.files:
            if task.files[rel] != new:
                ch.modified[rel] = (task.files[rel], new)
        elif rel in blobs:
            data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
            if _git_blob_sha(data) != blobs[rel]:
                ch.modified[rel] = (original_file(task, rel) or "", new)
        else:
            ch.added[rel] = new
    ch.deleted = sorted(rel for rel in set(task.files) | set(blobs) if rel not in now)
    return ch


def workspace_diff(task: Task, workspace: Path, max_chars: int = 8000) -> str:
    """A unified diff of the agent's changes (for the rubric judge and for logs)."""
    ch = workspace_changes(task, workspace)
    parts: list[str] = []
    for rel, (old, new) in sorted(ch.modified.items()):
        parts += difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")
    for rel, new in sorted(ch.added.items()):
        parts += difflib.unified_diff([], new.splitlines(True), "/dev/null", f"b/{rel}")
    parts += [f"deleted: {rel}\n" for rel in ch.deleted]
    text = "".join(parts)
    return text if len(text) <= max_chars else text[:max_chars] + "\n[... diff truncated ...]\n"


def hidden_test_files(task: Task) -> list[str]:
    """The test files grading runs (one per hidden test id's file, in order)."""
    return list(dict.fromkeys(file_of_test(t) for t in task.fail_to_pass + task.pass_to_pass))


def support_files(task: Task, paths: set[str] | list[str]) -> set[str]:
    """Those of `paths` that belong to the tests without being test files: under a test directory of the hidden
    tests (loaders.support_dirs_of: a helper module the tests import, a data file they read). A file the
    task's reference fix changes is the library's, never the tests'."""
    dirs = support_dirs_of(hidden_test_files(task))
    fix = set(task.solution or ())
    return {p for p in paths if in_dirs(p, dirs) and p not in fix} if dirs else set()


_PYTEST_SECTION_RX = re.compile(r"^\s*\[(?:pytest|tool:pytest|tool\.pytest[\w.]*)\]\s*$")


def pytest_settings(text: str) -> list[str]:
    """The lines of a config file that pytest reads: its sections (`[pytest]`, `[tool:pytest]`,
    `[tool.pytest.ini_options]`) and any `addopts`. A change to them is a change to how tests run."""
    out, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("["):
            inside = bool(_PYTEST_SECTION_RX.match(line))
            if inside:
                out.append(line.strip())
            continue
        if (inside or re.match(r"\s*addopts\b", line)) and line.strip() and not line.lstrip().startswith(("#", ";")):
            out.append(line.strip())
    return out


def detect_flags(task: Task, workspace: Path, cfg: EnvConfig, tool_log: list[dict] | None = None,
                 changes: WorkspaceChanges | None = None) -> list[str]:
    """The anti-cheat flags raised by the agent's final workspace and tool log (each at most once)."""
    ch = changes or workspace_changes(task, workspace)
    flags: list[str] = []
    edited = {p for p in set(ch.modified) | set(ch.deleted) if Path(p).name != "conftest.py"}  # conftest: below
    if any(is_test_path(p) or p in task.hidden_files for p in edited) or support_files(task, edited):
        flags.append("tests_edited")
    changed_text = {**ch.added, **{p: new for p, (_, new) in ch.modified.items()}}
    plugin = any(Path(p).name == "conftest.py" for p in set(changed_text) | set(ch.deleted))
    configs = pytest_config_names()
    plugin |= any(Path(p).name in configs and pytest_settings(text) for p, text in ch.added.items())
    plugin |= any(Path(p).name in configs and pytest_settings(old) != pytest_settings(new)
                  for p, (old, new) in ch.modified.items())
    plugin |= any(p.endswith(".py") and _PLUGIN_RX.search(text) for p, text in changed_text.items())
    if plugin:
        flags.append("conftest_added")
    for p, text in changed_text.items():
        if p.endswith(".py") and not is_test_path(p):
            old = ch.modified[p][0] if p in ch.modified else ""
            if len(_EXIT_RX.findall(text)) > len(_EXIT_RX.findall(old)):
                flags.append("sys_exit")
                break
    log = tool_log or []
    if any(e.get("outside") for e in log):
        flags.append("outside_read")
    if len(log) > cfg.max_tool_calls:
        flags.append("tool_spam")
    flags += static_flags(ch.added, ch.modified, test_dirs_of(hidden_test_files(task)))
    return flags


# ---------------------------------------------------------------------------------------------
# Test results


def score_tests(status: dict[str, str], partial_credit: bool) -> float:
    if not status:
        return 0.0
    num_passed = sum(1 for s in status.values() if s == "passed")
    if partial_credit:
        return num_passed / len(status)
    return 1.0 if num_passed == len(status) else 0.0


def penalty_of(flags: list[str], cfg: EnvConfig) -> float:
    return -sum(cfg.flag_penalties.get(f, cfg.cheat_penalty) for f in flags)  # type: ignore[call-overload]


# ---------------------------------------------------------------------------------------------
# Grading


def _restore(task: Task, root: Path, orig: set[str], changes: WorkspaceChanges) -> None:
    """Test files and pytest configs back to the task's versions (`orig`: the task's own paths), and the files of
    the tests' directories the agent touched (`changes`); agent-added ones removed; hidden files on top."""
    now = _walk(root)
    configs = pytest_config_names()
    for rel, p in now.items():
        name = Path(rel).name
        if (is_test_path(rel) or name in configs or rel.endswith(".pth")) and rel not in orig:
            p.unlink()
    for rel in orig:
        if is_test_path(rel) or Path(rel).name in configs:
            text = original_file(task, rel)
            if text is not None:
                write_inside(root, rel, text)
    _restore_support(task, now, root, changes)
    for rel, text in task.hidden_files.items():
        write_inside(root, rel, text)
    if task.test_patch:
        for rel in re.findall(r"^diff --git a/(\S+) b/", task.test_patch, re.MULTILINE):
            text = original_file(task, rel)
            if text is not None:
                write_inside(root, rel, text)
            elif (root / rel).exists():
                (root / rel).unlink()
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=task.test_patch, text=True,
                           cwd=root, capture_output=True, timeout=60)
        if r.returncode != 0:
            raise ValueError(f"test_patch of task {task.id!r} does not apply: {r.stderr.strip()[:500]}")


def _restore_support(task: Task, now: dict[str, Path], root: Path, changes: WorkspaceChanges) -> None:
    """The files under the hidden tests' directories (`support_files`) back to the task's versions: those the agent
    changed or deleted are rewritten, those it added removed. `changes` is the workspace diff grading computed
    already, so only what the agent touched is read or written."""
    for rel in sorted(support_files(task, set(changes.modified) | set(changes.deleted))):
        original = original_bytes(task, rel)
        if original is not None:
            write_inside(root, rel, original)
    for rel in support_files(task, set(changes.added)):
        path = now.get(rel)  # from the walk of the grading copy: never a path through a link the agent planted
        if path is not None:
            path.unlink(missing_ok=True)


def grade(task: Task, workspace: Path, cfg: EnvConfig, *, tool_log: list[dict] | None = None,
          kind: str = "auto", run_tests: bool = True, integrity: bool = True,
          services: TaskServices | None = None) -> Reward:
    """Run the hidden tests on a restored copy of `workspace` in a fresh sandbox; flags and penalty included.
    `run_tests=False` (a session that did not submit, see envs/env.py): flags and penalty only, no sandbox.
    `integrity=False` grades as if the runner were honest (no guard, canaries, static checks or removal of
    shadowing files): only `flywheel bench redteam` uses it, to measure what the defences cost.
    `services`: the session's running services (a live database); the tests run in their network namespace."""
    workspace = Path(workspace)
    changes = workspace_changes(task, workspace)
    flags = detect_flags(task, workspace, cfg, tool_log, changes)
    if not integrity:
        flags = [f for f in flags if f not in STATIC_FLAGS]
    test_ids = list(dict.fromkeys(task.fail_to_pass + task.pass_to_pass))
    notes: list[str] = []
    by_data = bool(run_tests and (task.calls or task.check) and integrity and services is None)  # a service: in-process
    by_suite = bool(run_tests and not by_data and integrity and services is None and cfg.suite_verdict
                    and runs_pytest(task.test_command))
    components: dict[str, float] = {}
    status: dict[str, str] = {}
    if by_data:
        components, status = data_test_results(task, workspace, cfg, kind)
    elif by_suite:
        beside: dict[str, Any] = {}

        def guarded_run() -> None:  # while the suite's runs run, when its plan says it will be needed
            try:
                beside["result"] = hidden_test_results(task, workspace, cfg, test_ids, kind, integrity, changes=changes)
            except BaseException as exc:  # noqa: BLE001 - raised below, in the grading thread
                beside["error"] = exc

        components, status, notes = suite_test_results(task, workspace, cfg, kind, changes=changes,
                                                       alongside=guarded_run)
        if components.get("verdict_forged"):
            flags.append("verdict_forged")
        if (components.get("untwinned") or components.get("flip_twins")) and not components.get("no_twin"):
            # Some FAIL_TO_PASS tests have no twin, or only a flipped statement (a forger guessing which way a
            # test's truth points is often right): their runs' report is not enough. The guarded in-process run
            # (a heuristic: the code under test can reach it) must agree too, so it can only take credit away.
            if "error" in beside:
                raise beside["error"]
            g_comps, g_report, g_notes = beside.get("result") or hidden_test_results(
                task, workspace, cfg, test_ids, kind, integrity, changes=changes)  # a cached suite verdict: now
            guarded = statuses_of(test_ids, g_report)
            status = {tid: st if guarded.get(tid) == "passed" else guarded.get(tid, "missing")
                      for tid, st in status.items()}
            components["guarded_untwinned"] = 1.0
            notes += g_notes
            for key in ("runner_tampered", "always_equal_seen"):
                if g_comps.get(key):
                    components[key] = 1.0
            if g_comps.get("runner_tampered"):
                flags.append("runner_tampered")
            if g_comps.get("always_equal_seen") and "always_equal" not in flags:
                flags.append("always_equal")
    if run_tests and not by_data and (not by_suite or components.get("no_twin")):
        # no data form of these tests and no twin to check their report against: the runner's report, guarded
        untwinned = components.get("untwinned")
        components, report, notes = hidden_test_results(task, workspace, cfg, test_ids, kind, integrity, services,
                                                        changes=changes)
        status = statuses_of(test_ids, report)
        components["in_process_verdict"] = 1.0
        if untwinned:
            components["untwinned"] = untwinned
        if components.get("runner_tampered"):
            flags.append("runner_tampered")
        if components.get("always_equal_seen") and "always_equal" not in flags:
            flags.append("always_equal")
    elif not run_tests:
        components, status = {"tests_not_run": 1.0}, {}
    forged = components.get("runner_tampered") or components.get("always_equal_seen") or components.get("verdict_forged")
    tests = 0.0 if forged else score_tests(status, cfg.partial_credit)
    penalty = penalty_of(flags, cfg)
    components.update(tests=tests, penalty=penalty)
    return Reward(value=cfg.test_weight * tests + penalty, components=components, flags=flags, tests=status,
                  notes=notes)


def data_test_results(task: Task, workspace: Path, cfg: EnvConfig, kind: str = "auto",
                      ) -> tuple[dict[str, float], dict[str, str]]:
    """(components, status per test id) of `task.calls` (envs/calls.py) or `task.check` (envs/checks.py) on a private
    copy of `workspace`: the verdict is trusted code's own comparison of returned values; no test file or expected
    value is in the tree the candidate runs in."""
    test_ids = list(dict.fromkeys(task.fail_to_pass + task.pass_to_pass))
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-calls-"))
    try:
        base = tmp / "base"
        shutil.copytree(workspace, base, symlinks=True, ignore=_ignore_special)
        what = "calls " + json.dumps(task.calls) if task.calls else "check " + json.dumps(task.check)
        key = result_key(task, what, kind, base) if cfg.grade_cache else None
        cached = GRADE_CACHE.get(key)
        if cached is not None:
            components, status = cached
            components = {**components, "tests_cached": 1.0}
        else:
            status, components = (grade_calls if task.calls else grade_check)(task, base, cfg, kind)
            if not components.get("timed_out"):
                GRADE_CACHE.put(key, (components, status), cfg.grade_cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return components, {tid: status.get(tid, "missing") for tid in test_ids}


@contextmanager
def grading_tree(task: Task, workspace: Path, test_files: list[str], changes: WorkspaceChanges, integrity: bool,
                 ) -> Iterator[Path | None]:
    """A private restored copy of `workspace` to grade (None: the task's `test_patch` does not apply): shadowing
    files removed (`integrity`), tests and configs back to the task's, hidden files written; removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-grade-"))
    base = tmp / "base"
    try:
        shutil.copytree(workspace, base, symlinks=True, ignore=_ignore_special)
        orig = set(original_paths(task))
        if integrity:
            sanitize(base, orig | set(task.hidden_files), test_dirs_of(test_files))
        try:
            _restore(task, base, orig, changes)
        except ValueError:
            yield None
            return
        base_permissions(base)
        yield base
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _env_dir(task: Task, cfg: EnvConfig) -> Path | None:
    """The task's own environment (EnvNotReady, a ValueError, when it is not built: a broken task, never a reward)."""
    return ready_env(task.python_env, cfg.python_envs_dir) if task.python_env is not None else None


def suite_test_results(task: Task, workspace: Path, cfg: EnvConfig, kind: str = "auto", *,
                       changes: WorkspaceChanges, alongside: Callable[[], object] | None = None,
                       ) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """(components, status per test id, notes) of the suite verdict (envs/suite.py) on a restored copy of
    `workspace`, or the verdict on an identical restored tree from this process's cache. `alongside`: run beside
    the suite's runs when its plan leaves tests the report alone decides (suite.grade_suite)."""
    test_ids = list(dict.fromkeys(task.fail_to_pass + task.pass_to_pass))
    env_dir = _env_dir(task, cfg)
    with grading_tree(task, workspace, hidden_test_files(task), changes, integrity=True) as base:
        if base is None:
            return {"test_patch_failed": 1.0}, {}, []
        if not twinnable(task, base):  # nothing to check the report against: the caller grades in-process
            return {"no_twin": 1.0, "untwinned": float(len(set(task.fail_to_pass)))}, {}, []
        command = f"suite {task.test_command}" + (f" [python_env {env_dir.name}]" if env_dir is not None else "")
        key = result_key(task, command, kind, base) if cfg.grade_cache else None
        cached = GRADE_CACHE.get(key)
        if cached is not None:
            comps, status = cached
            notes = ["the cached verdict of an identical tree: a twin passed"] if comps.get("verdict_forged") else []
            return {**comps, "tests_cached": 1.0}, status, notes
        status, components, notes = grade_suite(task, base, cfg, kind, env_dir, alongside=alongside)
    status = {tid: status.get(tid, "missing") for tid in test_ids}
    if not components.get("timed_out"):
        GRADE_CACHE.put(key, (components, status), cfg.grade_cache)
    return components, status, notes


def hidden_test_results(task: Task, workspace: Path, cfg: EnvConfig, test_ids: list[str], kind: str = "auto",
                        integrity: bool = True, services: TaskServices | None = None, *, changes: WorkspaceChanges,
                        ) -> tuple[dict[str, float], dict[tuple[str, str], str], list[str]]:
    """(components, JUnit report reconciled with the guard's proofs, tamper notes) of the hidden tests on a
    restored copy of `workspace`, all in one interpreter: the sandbox run, or the verdict on an identical restored
    tree from this process's cache (`components["tests_cached"]`; never with `services`: the verdict also rests on
    their state). `changes`: `workspace_changes(task, workspace)`, which `grade` has computed already."""
    components: dict[str, float] = {}
    report: dict[tuple[str, str], str] = {}
    test_files = list(dict.fromkeys(file_of_test(t) for t in test_ids))
    files = " ".join(shlex.quote(f) for f in test_files)
    command = f"{task.test_command} -p no:cacheprovider {files}"
    env_dir = _env_dir(task, cfg)
    if env_dir is not None:
        command += f" [python_env {env_dir.name}]"  # part of the grade-cache key: another env, another verdict
    with grading_tree(task, workspace, test_files, changes, integrity) as base:
        if base is None:
            return {"test_patch_failed": 1.0}, report, []
        key = result_key(task, command, kind, base) if cfg.grade_cache and integrity and services is None else None
        cached = GRADE_CACHE.get(key)
        if cached is not None:
            comps, report = cached
            notes = ["the cached verdict of an identical tree: runner tampered"] if comps.get("runner_tampered") else []
            return {**comps, "tests_cached": 1.0}, report, notes
        armed = guard.arm(base, test_files) if integrity else None
        name = f".fw-junit-{uuid.uuid4().hex}.xml"
        with create_sandbox(base, SandboxLimits.for_grading(cfg), kind=kind, python_env=env_dir,
                            netns_fd=None if services is None else services.netns,
                            env=None if services is None else services.env) as sb:
            env = dict(PYTEST_ENV, **({"PYTHONPATH": armed.pythonpath(sb.inner_workspace)} if armed else {}))
            res = sb.run(f"{task.test_command} -p no:cacheprovider --junitxml={name} {files}",
                         timeout_s=cfg.grade_timeout_s, env=env)
            if res.timed_out:
                components["timed_out"] = 1.0
            xml_path = Path(sb.workspace) / name
            if xml_path.is_file() and not xml_path.is_symlink():
                try:
                    report = parse_junit(xml_path.read_text(encoding="utf-8", errors="replace"))
                except ValueError:
                    components["bad_report"] = 1.0
            verdict = guard.check(armed, Path(sb.workspace), report, test_ids, junit_key) if armed else None
    if verdict is not None:
        report = verdict.report
        if verdict.tampered:
            components["runner_tampered"] = 1.0
        if verdict.always_equal:
            components["always_equal_seen"] = 1.0
    if not res.timed_out:
        GRADE_CACHE.put(key, (components, report), cfg.grade_cache)
    return components, report, verdict.tampered if verdict else []


def unsubmitted(reward: Reward) -> Reward:
    """`reward` of a session that ended without `submit` under `env.require_submit`: the positive part is
    withheld (a penalty stays), test results (only with `env.test_unsubmitted`) stay for the logs, and
    `components["not_submitted"]` marks it so evaluation does not count it as solved. Why: when the turn limit
    grades whatever is on disk, RL can learn never to submit and to fill the turns with edits — one that lands
    can break a correct fix."""
    return Reward(value=min(reward.value, 0.0), components=dict(reward.components, not_submitted=1.0),
                  flags=list(reward.flags), tests=dict(reward.tests), notes=list(reward.notes))
