"""The suite verdict: a repository's pytest tests, and twin runs that a correct fix must fail.

    status, components, notes = grade_suite(task, base, cfg, kind, env_dir)   # base: the restored grading tree

Why: a verdict read from what the process under test reports (its JUnit file, its exit status, proofs signed in
its own interpreter) is a verdict that process can write. Here what the process reports is still the evidence,
but the grader also asks the same question with a wrong answer, and code that cannot tell the two apart without
the right answer cannot make only the real one pass.

* The runs: the graded tests, each run in a fresh interpreter on a fresh copy-on-write view of the tree (forked
  from one that imported pytest, sandbox/forked.py, or a sandbox each), under a runner configuration the grader
  passes explicitly: `-c` the task's own original config file (or /dev/null), `--rootdir` the workspace, plugin
  autoload off, no cache provider. No config file of the agent's is ever read.
* Twin runs (envs/twins.py): for up to `env.max_twins` FAIL_TO_PASS tests, chosen at grading time, a run with the
  same command, file names and node ids where that one test has one expected literal changed (else, for a test with
  none, one statement's truth flipped: a weaker twin, envs/twins.py says why). A correct fix fails that test in its
  twin run. A literal in the body of a parametrized function is every row's, so the function's other rows take no
  status from that twin run. A parametrized test's twin changes its row of the table instead (envs/param_twins.py):
  it reports under the row's new id, every run selects such a function whole, and the tests that read that table
  take no status from the twin run. With two twins or more, the twin runs are all the runs: every other test is as
  it is in a twin run, so a test's own status is its status in the runs where it is not the twinned one ("passed"
  only if it passed in each of them). A test that no run keeps as it is (a lone twin's, or one reading a table every
  twin changed) gets one more run that keeps every test as it is.
* A test's status in a run is what the run's report says when the interpreter exits 0 or 1 (any other status, a
  timeout or a missing entry fails it). A test that passes in its twin run is `verdict_forged`: no test credit,
  the flag raised, whatever the other runs say. That is every way of passing without computing the right answer:
  a patched runner, a rewritten report, an exit status chosen by the code, an object equal to anything, an answer
  read from the test file (the twin's file holds the twin's value). It is raised even when the other runs failed
  the test: code that forges only sometimes (by a coin, or by a hash of the file it sees) passes an untouched run
  and not the twin as often as the other way round, so with the flag's penalty at least the test reward it earns
  nothing in expectation. The price: a wrong answer that happens to equal the twin's changed value is flagged.
* PASS_TO_PASS tests are in every run when there are at most `SMALL_SUITE` of them; a larger set (a mined task
  has hundreds) runs once, in its own fresh interpreter, and the twin runs hold only the FAIL_TO_PASS tests.

What it does not cover (docs/integrity.md): a FAIL_TO_PASS test with no qualifying literal or row has no twin
(`components["untwinned"]` counts them), nor do those past `env.max_twins` in a grading (a run that forges a few
of many tests is caught only when one of them is drawn); PASS_TO_PASS tests have no twins; a twin is as hidden
as its new value is plausible. Cost: max(2, twins) (+1 for a large PASS_TO_PASS set) interpreters,
`env.grade_parallel` at a time.
Tests: tests/unit/test_suite.py, tests/unit/test_param_twins.py, tests/redteam/.
"""

from __future__ import annotations

import logging
import random
import re
import shlex
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from flywheel.config import EnvConfig
from flywheel.envs import param_twins, twins
from flywheel.envs.junit import junit_key, parse_junit
from flywheel.envs.startup import pytest_config_names
from flywheel.sandbox.forked import ForkedRun, forked_available, overwrite, run_forked
from flywheel.sandbox.sandbox import BWRAP_WORKSPACE, SandboxLimits, create_sandbox
from flywheel.tasks.loaders import file_of_test, node_parts, original_file
from flywheel.types import Task

log = logging.getLogger(__name__)
PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # every grading run (reward.py imports it)
# The section a shared config file must hold to count as pytest's; pytest's own files (pytest.ini, pytest.toml,
# their dot-names) always count. The names and their order come from the installed pytest (envs/startup.py).
CONFIG_SECTIONS = {"pyproject.toml": "[tool.pytest", "tox.ini": "[pytest]", "setup.cfg": "[tool:pytest]"}
SMALL_SUITE = 32  # PASS_TO_PASS tests up to this many go into every run


@dataclass
class Run:
    """One interpreter: the node ids it reports on, the files written over the tree first, the twin it checks."""

    ids: list[str]
    files: dict[str, str] = field(default_factory=dict)
    twin_of: str | None = None  # the FAIL_TO_PASS test whose expected literal this run changed
    twin_id: str | None = None  # the node id its twin reports under (a table row's new id; else `twin_of`)
    ignore: frozenset[str] = frozenset()  # tests that read the table the twin changed: no status from this run
    select: list[str] | None = None  # what the runner is asked to collect (None: `ids`)
    flip: bool = False  # the twin flips a statement's truth (twins.choose_twin): weaker than a changed literal

    @property
    def reads(self) -> list[str]:
        """The node ids read from the run's report."""
        twin = self.twin_id or self.twin_of
        return self.ids + [twin] if twin is not None and twin not in self.ids else self.ids


@dataclass(frozen=True)
class _Twin:
    tid: str
    path: str
    source: str  # the test file with the twin written in
    twin_id: str
    ignore: frozenset[str]
    flip: bool = False


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
        for name in pytest_config_names():
            section = CONFIG_SECTIONS.get(name)
            rel = str(d / name) if str(d) != "." else name
            text = original_file(task, rel)
            if text is not None and (section is None or any(line.strip().startswith(section)
                                                            for line in text.splitlines())):
                return rel
    return None


def plan(task: Task, base: Path, rng: random.Random, max_twins: int) -> tuple[list[Run], int]:
    """The runs of one grading and how many FAIL_TO_PASS tests have no twin. With two twins or more, every run is a
    twin run: a test's own status comes from the runs where it is not the twinned one (see the module doc)."""
    f2p = list(dict.fromkeys(task.fail_to_pass))
    p2p = [t for t in dict.fromkeys(task.pass_to_pass) if t not in f2p]
    together = len(p2p) <= SMALL_SUITE
    ids = f2p + p2p if together else f2p
    sources: dict[str, str] = {}

    def source(path: str) -> str:
        if path not in sources:
            try:
                sources[path] = (base / path).read_bytes().decode("utf-8")  # as it is: no newline translation
            except (OSError, UnicodeDecodeError):
                sources[path] = ""
        return sources[path]

    twinned: list[_Twin] = []
    for tid in f2p:
        path, classes, name = node_parts(tid)
        text = source(path)
        made = twins.choose_twin(text, tuple(classes), name, rng) if text else None
        if made is not None:
            twin, flip = made
            # a literal in the body of a parametrized function is every row's: the function's other rows see the
            # change in this twin run, so none of their statuses comes from it
            function, row = tid.partition("[")[::2]
            rows = frozenset(t for t in ids if t != tid and t.partition("[")[0] == function) if row else frozenset()
            twinned.append(_Twin(tid, path, twin, tid, rows, flip))
            continue
        table = param_twins.param_twin(text, tuple(classes), name, rng) if text else None
        if table is not None:
            twinned.append(_Twin(tid, path, table.source, f"{tid.partition('[')[0]}[{table.twin_row}]",
                                 _readers(ids, path, table, source)))
    chosen = rng.sample(twinned, min(max_twins, len(twinned)))
    # Every run writes the same files (the originals, or a twin in its own run): a rewritten file differs from an
    # untouched one in ways a run can see (its inode, its layer), so no run may be the only one to rewrite it.
    same = {t.path: sources[t.path] for t in chosen}
    runs = [Run(ids, {**same, t.path: t.source}, t.tid, t.twin_id, t.ignore, flip=t.flip) for t in chosen]
    if not runs or any(all(tid == r.twin_of or tid in r.ignore for r in runs) for tid in ids):
        runs.insert(0, Run(ids, dict(same)))  # a test no run keeps as it is (a lone twin's): one run with no twin
    if not together:
        runs.append(Run(p2p, dict(same)))
    # A changed table row reports under a new id, so a node id of that function would be "not found" in the twin
    # run: every run selects such a function whole (the same arguments in every run) and reads the ids it wants.
    whole = {tid.partition("[")[0] for t in chosen for tid in (t.ignore | {t.tid}) if "[" in tid}
    for run in runs:
        if whole:
            run.select = list(dict.fromkeys(tid.partition("[")[0] if tid.partition("[")[0] in whole else tid
                                            for tid in run.ids))
    return runs, len(f2p) - len(twinned)


def _readers(ids: list[str], path: str, table: param_twins.ParamTwin, source: Callable[[str], str],
             ) -> frozenset[str]:
    """The tests among `ids` that see the row `table` changes: the row's own test in each function whose one
    parametrize table it is, every test of the file's other functions that name it, and every test of another
    file whose source names it (an import of the table)."""
    out = set()
    for tid in ids:
        p, classes, name = node_parts(tid)
        if p == path:
            base, _, rest = name.partition("[")
            key = (tuple(classes), base)
            if key in table.readers or (key in table.row_readers and rest == f"{table.row}]"):
                out.add(tid)
        elif table.table is not None and re.search(rf"\b{re.escape(table.table)}\b", source(p)):
            out.add(tid)
    return frozenset(out)


def twinnable(task: Task, base: Path) -> bool:
    """Does any FAIL_TO_PASS test of the task have a twin on this restored tree? A task with none has nothing to
    check its report against: the grader takes the guarded in-process path for it instead (envs/reward.py)."""
    runs, _ = plan(task, base, random.Random(0), 1)
    return any(r.twin_of is not None for r in runs)


def runner_args(task: Task, run: Run, inner_workspace: str, junit: str) -> list[str]:
    """The grader's runner configuration and selection, after the task's own command: exactly `run.ids`."""
    config = runner_config(task, [file_of_test(t) for t in run.ids])
    ini = f"{inner_workspace}/{config}" if config else "/dev/null"
    return ["-p", "no:cacheprovider", "-c", ini, f"--rootdir={inner_workspace}", f"--junitxml={junit}",
            *(run.ids if run.select is None else run.select)]


def command_of(task: Task, run: Run, inner_workspace: str, junit: str) -> str:
    """The task's test command under the grader's runner configuration, selecting exactly `run.ids`."""
    return " ".join([task.test_command, *(shlex.quote(a) for a in runner_args(task, run, inner_workspace, junit))])


def forked_form(command: str) -> tuple[str, list[str]] | None:
    """("module" | "console", the command's own arguments) where the forked runs can reproduce the task's command
    exactly (`python -m pytest ARGS`, `pytest ARGS`, the interpreter and script found on PATH), else None."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if not argv or "/" in argv[0]:
        return None
    if argv[0] in ("pytest", "py.test"):
        return "console", argv[1:]
    if argv[0] in ("python", "python3") and argv[1:3] == ["-m", "pytest"]:
        return "module", argv[3:]
    return None


def _one(task: Task, run: Run, base: Path, cfg: EnvConfig, kind: str, env_dir: Path | None,
         ) -> tuple[dict[str, str], bool]:
    """(status per node id, timed out) of one run in its own sandbox."""
    junit = f".fw-junit-{uuid.uuid4().hex}.xml"
    with create_sandbox(base, SandboxLimits.for_grading(cfg), kind=kind, python_env=env_dir) as sb:
        workspace = Path(sb.workspace)
        overwrite(workspace, base, run.files)  # the grader's restored copy: no link of the agent's on the way
        res = sb.run(command_of(task, run, sb.inner_workspace, junit), timeout_s=cfg.grade_timeout_s, env=PYTEST_ENV)
        xml = workspace / junit
        report: dict[tuple[str, str], str] = {}
        if xml.is_file() and not xml.is_symlink():
            try:
                report = parse_junit(xml.read_text(encoding="utf-8", errors="replace"))
            except ValueError:
                report = {}
    if res.timed_out or res.returncode not in (0, 1):
        return {tid: "error" for tid in run.reads}, res.timed_out
    return {tid: report.get(junit_key(tid), "missing") for tid in run.reads}, False


def _separate(task: Task, runs: list[Run], base: Path, cfg: EnvConfig, kind: str, env_dir: Path | None,
              ) -> list[tuple[dict[str, str], bool]]:
    """Each run in a sandbox of its own, started in a random order (uids and workspaces are handed out in the
    order sandboxes start, and `runs` comes in the plan's order)."""
    order = list(range(len(runs)))
    random.SystemRandom().shuffle(order)
    workers = max(1, min(cfg.grade_parallel, len(runs)))
    with ThreadPoolExecutor(workers, thread_name_prefix="flywheel-suite") as pool:
        done = list(pool.map(lambda i: _one(task, runs[i], base, cfg, kind, env_dir), order))
    out: list[tuple[dict[str, str], bool]] = [({}, False)] * len(runs)
    for i, result in zip(order, done):
        out[i] = result
    return out


def _forked(task: Task, runs: list[Run], base: Path, cfg: EnvConfig, form: tuple[str, list[str]],
            env_dir: Path | None) -> list[tuple[dict[str, str], bool]]:
    """Every run forked from one interpreter that imported pytest (sandbox/forked.py), with what `_one` reads."""
    script, own = form
    junits = [f".fw-junit-{uuid.uuid4().hex}.xml" for _ in runs]
    forked = [ForkedRun(run.files, [*own, *runner_args(task, run, BWRAP_WORKSPACE, junit)], junit)
              for run, junit in zip(runs, junits)]
    results = run_forked(base, forked, limits=SandboxLimits.for_grading(cfg), script=script,
                         timeout_s=cfg.grade_timeout_s, parallel=cfg.grade_parallel, python_env=env_dir,
                         env=PYTEST_ENV)
    out = []
    for run, res in zip(runs, results):
        if res.timed_out or res.returncode not in (0, 1):
            out.append(({tid: "error" for tid in run.reads}, res.timed_out))
            continue
        try:
            report = parse_junit(res.text) if res.text is not None else {}
        except ValueError:
            report = {}
        out.append(({tid: report.get(junit_key(tid), "missing") for tid in run.reads}, False))
    return out


def grade_suite(task: Task, base: Path, cfg: EnvConfig, kind: str = "auto", env_dir: Path | None = None,
                rng: random.Random | None = None, alongside: Callable[[], object] | None = None,
                ) -> tuple[dict[str, str], dict[str, float], list[str]]:
    """(status per test id, components, notes) of the task's tests on `base` (the restored grading tree, which
    the caller owns; it is only read). `rng`: the twins' choices (default: the system's randomness, or
    `env.twin_seed`). `alongside`: called in a thread while the runs run, when the plan leaves a FAIL_TO_PASS test
    untwinned or twinned by a flip (components `untwinned`, `flip_twins`): the guarded in-process run that must
    agree with the report then (envs/reward.py), on the cores the runs leave idle instead of after them."""
    if rng is None:
        rng = random.SystemRandom() if cfg.twin_seed is None else random.Random(f"{cfg.twin_seed} {task.id}")
    runs, untwinned = plan(task, base, rng, cfg.max_twins)
    components: dict[str, float] = {"suite_verdict": 1.0, "twins": float(sum(r.twin_of is not None for r in runs))}
    if untwinned:
        components["untwinned"] = float(untwinned)
    if flips := sum(r.flip for r in runs):
        components["flip_twins"] = float(flips)  # these tests pass through the guard too (envs/reward.py)
    beside = None
    if alongside is not None and (untwinned or flips):
        beside = threading.Thread(target=alongside, name=f"guarded-{task.id}", daemon=True)
        beside.start()
    try:
        results = _run_all(task, runs, base, cfg, kind, env_dir)
    finally:
        if beside is not None:
            beside.join()
    status: dict[str, str] = {}
    forged: list[str] = []
    for run, (out, timed_out) in zip(runs, results):
        if timed_out:
            components["timed_out"] = 1.0
        for tid in run.ids:
            if tid != run.twin_of and tid not in run.ignore and status.get(tid, "passed") == "passed":
                status[tid] = out[tid]  # passed only where it passed in every run that kept it as it is
        if run.twin_of is not None and out[run.twin_id or run.twin_of] == "passed":  # whatever the others say
            forged.append(run.twin_of)
    if forged:
        components["verdict_forged"] = 1.0
    return status, components, [f"{tid}: passed with one expected value changed (its twin run); in the runs that "
                                f"kept it as it is it {status.get(tid, 'missing')}" for tid in forged]


def _run_all(task: Task, runs: list[Run], base: Path, cfg: EnvConfig, kind: str,
             env_dir: Path | None) -> list[tuple[dict[str, str], bool]]:
    """Each run's (status per test id, timed out): forked from one interpreter where it can, else a sandbox each."""
    form = forked_form(task.test_command) if cfg.suite_fork and forked_available(kind) else None
    if form is not None:
        try:
            return _forked(task, runs, base, cfg, form, env_dir)
        except RuntimeError as exc:  # the zygote could not start (an interpreter without pidfd_open, ...)
            log.warning("task %s: forked grading runs failed (%s); running each in a sandbox of its own", task.id, exc)
    return _separate(task, runs, base, cfg, kind, env_dir)
