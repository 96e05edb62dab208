"""Per-repository environments and mined real-code tasks, end to end (tasks/repoenv.py, tasks/mine/, envs/verify.py).

A tiny project is written in the test (no download of its source); its environment is built from its own
pyproject.toml with pip from the package index this machine reaches (pytest, pinned, and `iniconfig`; pip's cache
makes later runs fast). Tasks are mined from it and graded through the real path (bwrap sandbox where available,
the venv bound read-only, the guard), and the sandbox is shown to run the task's Python, not the run's.
"""

import json
import subprocess
from pathlib import Path

import pytest

from flywheel.cli import main
from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.verify import verify_tasks
from flywheel.tasks.loaders import load_tasks, save_tasks
from flywheel.tasks.mine import mine_directory
from flywheel.tasks.repoenv import EnvNotReady, build_env, python_version, ready_env, spec_from_dir
from flywheel.types import ToolCall

CORE = '''"""Small helpers with real tests."""


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(xs):
    total = 0
    for x in xs:
        total += x
    return total / len(xs)


def words(text):
    out = []
    for w in text.split():
        out.append(w.lower())
    return out
'''
TESTS = '''import importlib.util
import sys

from tiny.core import clamp, mean, words


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
    assert clamp(2, 0, 3) == 2


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_words():
    assert words("A b  C") == ["a", "b", "c"]


def test_runs_in_the_task_environment():
    assert importlib.util.find_spec("iniconfig") is not None  # the project's own dependency
    assert importlib.util.find_spec("flywheel") is None, sys.path  # never the run's venv
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-src")
    (root / "tiny").mkdir()
    (root / "tiny" / "__init__.py").write_text("")
    (root / "tiny" / "core.py").write_text(CORE)
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(TESTS)
    (root / "pyproject.toml").write_text('[project]\nname = "tiny"\nversion = "0.1"\ndependencies = ["iniconfig"]\n')
    return root


@pytest.fixture(scope="module")
def mined(project, tmp_path_factory):
    cache = tmp_path_factory.mktemp("mine")
    envs = tmp_path_factory.mktemp("envs")
    tasks, report = mine_directory("tiny-0.1", project, cache, envs, max_tasks=3, seed=0)
    return tasks, report, envs


def test_environment_is_built_once_and_shared(mined, project):
    tasks, report, envs = mined
    assert report.env is not None and report.env.status == "built", report
    assert report.env.install_s > 0 and report.env.disk_bytes > 1_000_000
    assert any(p.startswith("iniconfig==") for p in report.env.packages)
    again = build_env(spec_from_dir(project, name="tiny"), envs)
    assert again.status == "cached" and again.path == report.env.path
    assert {json.dumps(t.python_env, sort_keys=True) for t in tasks} == {json.dumps(again and tasks[0].python_env,
                                                                                    sort_keys=True)}


def test_mined_tasks_go_pass_to_fail_and_verify_through_grading(mined, tmp_path):
    tasks, report, envs = mined
    assert report.baseline_passed == 4 and len(tasks) == 3, report
    for t in tasks:
        assert t.fail_to_pass and set(t.fail_to_pass) | set(t.pass_to_pass) <= {
            f"tests/test_core.py::test_{n}" for n in ("clamp", "mean", "words", "runs_in_the_task_environment")}
        assert "tests/test_core.py::test_runs_in_the_task_environment" in t.pass_to_pass
        changed = [ln[1:].strip() for ln in t.meta["patch"].splitlines()
                   if ln[:1] in "+-" and not ln.startswith(("+++", "---")) and ln[1:].strip()]
        assert changed and not any(c in t.problem for c in changed)  # names the failing tests, never the fix
        assert t.solution and list(t.solution) == ["tiny/core.py"]
    path = tmp_path / "mined.jsonl"
    save_tasks(tasks, path)
    load = load_tasks(path)
    assert not load.errors and len(load.tasks) == 3
    results = verify_tasks(load.tasks, EnvConfig(grade_cache=0, python_envs_dir=str(envs)))
    assert [(r.solved, r.untouched, r.flags, r.error) for r in results] == [(1.0, 0.0, [], "")] * 3


def test_agent_sandbox_runs_the_task_environment(mined, tmp_path):
    tasks, _, envs = mined
    with CodingEnv(EnvConfig(python_envs_dir=str(envs)), tmp_path / "cache") as env:
        env.reset(tasks[0])
        out, _ = env.step([ToolCall("bash", {"command": "python -c 'import sys, iniconfig; print(sys.prefix)'"})])
        assert out[0].content.strip().splitlines()[0] == env.sandbox.inner_python_env
        out, _ = env.step([ToolCall("bash", {"command": f"touch {env.sandbox.inner_python_env}/x"})])
        assert "exit code" in out[0].content  # bound read-only


def test_a_failed_build_is_a_clear_task_error(mined, tmp_path, capsys):
    tasks, _, _ = mined
    envs = tmp_path / "envs"
    spec = {"name": "broken", "python": python_version(), "requirements": ["flywheel-no-such-package-zz9==1.0"]}
    b = build_env(spec, envs)
    assert b.status == "failed" and "flywheel-no-such-package-zz9" in b.error
    assert build_env(spec, envs).status == "failed"  # recorded: not retried without --retry
    with pytest.raises(EnvNotReady, match="failed to build"):
        ready_env(spec, envs)
    task = tasks[0]
    task.python_env = spec
    path = tmp_path / "t.jsonl"
    save_tasks([task], path)
    assert main(["tasks", "check", str(path), "--envs-dir", str(envs)]) == 1
    out = capsys.readouterr().out
    assert f"broken: task {task.id!r}: the environment broken" in out and "failed to build" in out
    assert main(["envs", "build", str(path), "--envs-dir", str(envs)]) == 1
    assert "failed" in capsys.readouterr().out


def test_mine_command_writes_verified_tasks(project, tmp_path, mined):
    _, _, envs = mined
    out = tmp_path / "t.jsonl"
    rc = main(["tasks", "mine", "--dir", f"tiny-0.1={project}", "--out", str(out), "--cache-dir",
               str(tmp_path / "cache"), "--envs-dir", str(envs), "--max-per-project", "1", "--verify"])
    assert rc == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    assert main(["envs", "build", str(out), "--envs-dir", str(envs)]) == 0
    git = subprocess.run(["git", "-C", str(tmp_path / "cache" / "repos" / "tiny-0.1"), "for-each-ref",
                          "refs/flywheel/"], capture_output=True, text=True, check=True).stdout
    assert git.count("refs/flywheel/") == 2  # the original and one per task
    assert Path(json.loads(lines[0])["repo"]).is_dir()
