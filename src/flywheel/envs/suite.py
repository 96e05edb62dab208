"""The suite verdict: a repository's pytest tests, each FAIL_TO_PASS test in its own interpreter beside a twin.

    status, components, notes = grade_suite(task, base, cfg, kind, env_dir)   # base: the restored grading tree

Why: a verdict read from what the process under test reports (its JUnit file, its exit status, proofs signed in
its own interpreter) is a verdict that process can write. Here the grader decides from two facts it observes
from outside, and from a counterfactual that the code under test cannot fake without the answer:

* Every FAIL_TO_PASS test runs alone in a fresh sandbox on a fresh copy-on-write view of the tree (so no run can
  leave anything for another), under a runner configuration the grader passes explicitly: `-c` the task's own
  original config file (or /dev/null), `--rootdir` the workspace, plugin autoload off, no cache provider. Nothing
  the agent wrote can change how pytest starts: the agent's config files are never read.
* Beside it runs its twin (envs/twins.py): the same file with one expected literal of that test changed, chosen
  at grading time. Both runs have the same command, the same file names and the same node id; the one
  difference is the expected value. A correct fix fails the twin. A run passes when its interpreter exits 0 and
  its own report says passed (the report can only turn a pass into a failure: a skip exits 0 too).
* A twin that passes is `verdict_forged`: no test credit, the flag raised, whatever the real tests say. That is
  every way of passing without computing the right answer: a patched runner, a rewritten report, an exit status
  chosen by the code, an object equal to anything, an answer read from the test file (the twin's file holds the
  twin's value). It is raised even when the real test failed: code that forges only sometimes (by a coin, or by
  a hash of the file it sees) passes the real test and not the twin as often as the other way round, so with the
  flag's penalty at least the test reward it never earns more than it risks. The price: a wrong answer that
  happens to equal the twin's changed value is flagged too.
* PASS_TO_PASS tests run together in one more fresh interpreter under the same configuration (their number runs
  to hundreds in a mined task); a test passes when that run exits 0, or 1 with the report saying it passed.

What it does not cover (docs/integrity.md): a FAIL_TO_PASS test with no qualifying literal has no twin, so only
its exit status decides (`components["untwinned"]` counts them); PASS_TO_PASS tests have no twins (forging them
gains a session nothing unless the twinned tests pass on their own merit); a twin is as hidden as its new value
is plausible. Cost: 2 runs per twinned FAIL_TO_PASS test and 1 for the rest, `env.grade_parallel` at a time.
Tests: tests/unit/test_suite.py, tests/redteam/.
"""

from __future__ import annotations

import random
import shlex
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from flywheel.config import EnvConfig
from flywheel.envs import twins
from flywheel.envs.junit import junit_key, parse_junit
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox
from flywheel.tasks.loaders import file_of_test, node_parts, original_file
from flywheel.types import Task

PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
# pytest's config files in the order it tries them in each directory, and the section each must hold to count
CONFIG_FILES = (("pytest.ini", None), (".pytest.ini", None), ("pyproject.toml", "[tool.pytest"),
                ("tox.ini", "[pytest]"), ("setup.cfg", "[tool:pytest]"))


@dataclass
class Run:
    """One interpreter: the node ids it selects, the files written over the tree first, and what it is for."""

    ids: list[str]
    role: str  # "real", "twin" or "batch"
    files: dict[str, str] = field(default_factory=dict)


def runs_pytest(command: str) -> bool:
    """Is the task's test command pytest (`pytest ...`, `python -m pytest ...`)? Only those get the suite verdict."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    if not argv:
        return False
    if PurePosixPath(argv[0]).name in ("pytest", "py.test"):
        return True
    return len(argv) >= 3 and PurePosixPath(argv[0]).name.startswith("python") and argv[1:3] == ["-m", "pytest"]


def runner_config(task: Task, test_files: list[str]) -> str | None:
    """The config file pytest would have read in the task's original tree for these test files (nearest to their
    common directory first, as pytest looks), or None. Read from the task, never from the graded tree."""
    dirs = [PurePosixPath(f).parent for f in test_files] or [PurePosixPath(".")]
    common = dirs[0]
    while not all(d == common or common in d.parents for d in dirs):
        common = common.parent
    for d in [common, *common.parents]:
        for name, section in CONFIG_FILES:
            rel = str(d / name) if str(d) != "." else name
            text = original_file(task, rel)
            if text is not None and (section is None or any(line.strip().startswith(section)
                                                            for line in text.splitlines())):
                return rel
    return None


def plan(task: Task, base: Path, rng: random.Random) -> tuple[list[Run], int]:
    """The runs of one grading (shuffled) and how many FAIL_TO_PASS tests have no twin."""
    runs: list[Run] = []
    untwinned = 0
    for tid in dict.fromkeys(task.fail_to_pass):
        runs.append(Run([tid], "real"))
        path, classes, name = node_parts(tid)
        try:
            source = (base / path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            source = ""
        twin = twins.twin_source(source, tuple(classes), name, rng) if source else None
        if twin is None:
            untwinned += 1
        else:
            runs.append(Run([tid], "twin", {path: twin}))
    p2p = [t for t in dict.fromkeys(task.pass_to_pass) if t not in task.fail_to_pass]
    if p2p:
        runs.append(Run(p2p, "batch"))
    rng.shuffle(runs)
    return runs, untwinned


def command_of(task: Task, run: Run, inner_workspace: str, junit: str) -> str:
    """The task's test command under the grader's runner configuration, selecting exactly `run.ids`."""
    config = runner_config(task, [file_of_test(t) for t in run.ids])
    ini = f"{inner_workspace}/{config}" if config else "/dev/null"
    ids = " ".join(shlex.quote(t) for t in run.ids)
    return (f"{task.test_command} -p no:cacheprovider -c {shlex.quote(ini)} --rootdir={shlex.quote(inner_workspace)}"
            f" --junitxml={junit} {ids}")


def _one(task: Task, run: Run, base: Path, cfg: EnvConfig, kind: str, env_dir: Path | None,
         ) -> tuple[dict[str, str], bool]:
    """(status per node id, timed out) of one run in its own sandbox."""
    limits = SandboxLimits.for_grading(cfg)
    junit = f".fw-junit-{uuid.uuid4().hex}.xml"
    with create_sandbox(base, limits, kind=kind, python_env=env_dir) as sb:
        workspace = Path(sb.workspace)
        for rel, text in run.files.items():  # the tree is the grader's restored copy: no link of the agent's on the way
            (workspace / rel).unlink(missing_ok=True)
            (workspace / rel).write_text(text, encoding="utf-8")
        res = sb.run(command_of(task, run, sb.inner_workspace, junit), timeout_s=cfg.grade_timeout_s, env=PYTEST_ENV)
        xml = workspace / junit
        report: dict[tuple[str, str], str] = {}
        if xml.is_file() and not xml.is_symlink():
            try:
                report = parse_junit(xml.read_text(encoding="utf-8", errors="replace"))
            except ValueError:
                report = {}
    allowed = (0, 1) if run.role == "batch" else (0,)
    out = {}
    for tid in run.ids:
        said = report.get(junit_key(tid), "missing")
        if res.timed_out:
            out[tid] = "error"
        elif said == "passed":
            out[tid] = "passed" if res.returncode in allowed else "failed"
        else:
            out[tid] = said
    return out, res.timed_out


def grade_suite(task: Task, base: Path, cfg: EnvConfig, kind: str = "auto", env_dir: Path | None = None,
                rng: random.Random | None = None) -> tuple[dict[str, str], dict[str, float], list[str]]:
    """(status per test id, components, notes) of the task's tests on `base` (the restored grading tree, which
    the caller owns; it is only read). `rng`: the twins' choices (default: the system's randomness, or
    `env.twin_seed`)."""
    if rng is None:
        rng = random.SystemRandom() if cfg.twin_seed is None else random.Random(f"{cfg.twin_seed} {task.id}")
    runs, untwinned = plan(task, base, rng)
    components: dict[str, float] = {"suite_verdict": 1.0}
    if untwinned:
        components["untwinned"] = float(untwinned)
    workers = max(1, min(cfg.grade_parallel, len(runs)))
    with ThreadPoolExecutor(workers, thread_name_prefix="flywheel-suite") as pool:
        results = list(pool.map(lambda r: _one(task, r, base, cfg, kind, env_dir), runs))
    status: dict[str, str] = {}
    twin_passed: list[str] = []
    for run, (out, timed_out) in zip(runs, results):
        if timed_out:
            components["timed_out"] = 1.0
        if run.role == "twin":
            twin_passed += [tid for tid, s in out.items() if s == "passed"]
        else:
            status.update(out)
    if twin_passed:  # whether or not the real test passed: see the module doc
        components["verdict_forged"] = 1.0
    return status, components, [f"{tid}: its twin (one expected value changed) passed; the real test "
                                f"{status.get(tid, 'missing')}" for tid in twin_passed]
