"""Mining under limits (tasks/mine/mine.py, sandbox/bounded.py): a candidate bug whose test suite hangs — in the
pytest process itself, or in a grandchild it forked — is rejected with reason `timeout`, mining goes on to the next
candidate (and keeps those the suite catches), and nothing of the hung run is left (checked by the PIDs the hung
suites wrote, nothing else).

A tiny project is written in the test; one of its tests hangs whenever the function it tests is broken. Its
environment is built with pip from the package index this machine reaches (pytest only, pinned; pip's cache makes
it a few seconds).

    pytest tests/integration/test_mine_limits.py
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.config.mine import MineConfig
from flywheel.tasks.loaders import load_tasks
from flywheel.tasks.mine import mine_directory

CORE = '''"""Small helpers."""


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    out = 0
    for x in xs:
        out += x
    return out
'''

# A broken `clamp` fails its test as usual; a broken `total` makes its test hang: in pytest itself (`sleep`), or in
# a child process it waits for (`grandchild`).
TEST = '''import os
import subprocess
import sys
import time

from tiny.core import clamp, total

PIDS = {pids!r}
MODE = {mode!r}


def test_clamp():
    assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0 and clamp(2, 0, 3) == 2


def test_total():
    try:
        ok = total([1, 2, 3]) == 6 and total([]) == 0
    except Exception:
        ok = False
    if not ok:
        with open(PIDS, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        if MODE == "sleep":
            time.sleep(300)
        else:
            code = f"import os, time; open({{PIDS!r}}, 'a').write(f'{{{{os.getpid()}}}}\\\\n'); time.sleep(300)"
            subprocess.run([sys.executable, "-c", code])
    assert ok
'''


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for init (it has stopped running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def write_project(root: Path, mode: str, pids: Path) -> Path:
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "__init__.py").write_text("")
    (root / "tiny" / "core.py").write_text(CORE)
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(TEST.format(pids=str(pids), mode=mode))
    (root / "pyproject.toml").write_text('[project]\nname = "tiny"\nversion = "0.1"\n')
    return root


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("envs")  # shared: the second case's environment is a cache hit


@pytest.mark.parametrize("mode", ["sleep", "grandchild"])
def test_a_hanging_candidate_is_rejected_as_timeout_and_leaves_no_process(mode: str, tmp_path: Path,
                                                                          envs: Path) -> None:
    pids = tmp_path / "pids.txt"
    project = write_project(tmp_path / "src", mode, pids)
    limits = MineConfig(candidate_timeout_min_s=3, candidate_timeout_max_s=3)
    t0 = time.monotonic()
    tasks, report = mine_directory("tiny-0.1", project, tmp_path / "cache", envs, max_tasks=5, max_tries=3, seed=0,
                                   limits=limits)
    elapsed = time.monotonic() - t0
    assert report.error == "" and report.baseline_passed == 2, report
    assert report.tried == 3  # every try was made: a timeout does not stop mining
    assert sum(report.rejected.values()) + report.kept == report.tried
    # seed 0 tries a bug in `total` (hangs) and one in `clamp` (caught): if bugs.py changes its order, pick a seed
    # that still tries both
    assert report.rejected.get("timeout", 0) >= 1 and report.kept >= 1, (report.rejected, report.timeouts)
    assert len(report.timeouts) == report.rejected["timeout"]
    assert all(t.startswith("tiny/core.py:total ") for t in report.timeouts), report.timeouts
    assert len(tasks) == report.kept and all(t.meta["function"] == "clamp" for t in tasks)
    assert all(t.fail_to_pass == ["tests/test_core.py::test_clamp"] for t in tasks)
    hung = [int(w) for w in pids.read_text().split()]
    per_timeout = 1 if mode == "sleep" else 2  # pytest, and its child in the grandchild case
    # (a run slowed past 3 s by a loaded machine is also a timeout, without hanging: hence at least, not equal)
    assert per_timeout <= len(hung) <= per_timeout * report.rejected["timeout"]
    deadline = time.monotonic() + 5
    while not all(gone(p) for p in hung) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in hung if not gone(p)] == []
    assert elapsed < 3 * 3 + 60  # each try stopped at its 3 s limit (the rest: env build, baseline, git)


def test_a_project_that_cannot_be_read_is_reported_not_raised(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project\nname = ")  # not TOML
    tasks, report = mine_directory("broken-0.1", root, tmp_path / "cache", tmp_path / "envs")
    assert tasks == [] and report.tried == 0
    assert report.error.startswith("cannot import the project: cannot read the dependencies in pyproject.toml")


def test_an_interrupted_mine_writes_the_tasks_it_kept(tmp_path: Path, envs: Path) -> None:
    """Ctrl-C while a candidate's suite hangs: the hung run is killed, and the task file holds every task kept
    before it (a run of hours must not lose its tasks to one interrupt). Exit status 130, as a shell expects."""
    pids = tmp_path / "pids.txt"
    project = write_project(tmp_path / "src", "sleep", pids)
    out, cache = tmp_path / "tasks.jsonl", tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "tasks", "mine", "--dir", f"tiny-0.1={project}",
                             "--out", str(out), "--cache-dir", str(cache), "--envs-dir", str(envs), "--seed", "5",
                             "--max-tries", "4", "--mine.candidate_timeout_min_s=300",
                             "--mine.candidate_timeout_max_s=300"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            # Ctrl-C as at a terminal: a test run started in the background (`make test &`, some CI
                            # runners) passes SIGINT down ignored, and Python then never raises KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.05)
        hung = [int(w) for w in pids.read_text().split()]
        proc.send_signal(signal.SIGINT)
        log = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:  # it did not stop: do not leave it (and its hung suite) behind
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, log
    assert "interrupted: writing the" in log
    tasks = load_tasks(out).tasks
    # seed 5 tries two `clamp` bugs before a hanging `total` one (if bugs.py changes its order: pick a seed
    # that still does)
    assert len(tasks) >= 1 and all(t.meta["function"] == "clamp" for t in tasks), log
    refs = subprocess.run(["git", "-C", str(cache / "repos" / "tiny-0.1"), "for-each-ref", "refs/flywheel/"],
                          capture_output=True, text=True).stdout.split("\n")
    assert len([r for r in refs if r and not r.endswith("refs/flywheel/original")]) == len(tasks)
    deadline = time.monotonic() + 5
    while not all(gone(p) for p in hung) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in hung if not gone(p)] == []
