"""Task loaders on small fixture files, broken tasks included; workspaces materialised from files and git."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flywheel.tasks.loaders import (
    TaskLoadError,
    file_of_test,
    is_test_path,
    load_tasks,
    original_file,
    save_tasks,
    task_base_dir,
)
from flywheel.types import Task

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def make_repo(repos_dir: Path) -> str:
    """The fixture repository `acme/mini` as a local clone `repos_dir/acme__mini`; returns the commit."""
    dest = repos_dir / "acme__mini"
    shutil.copytree(FIX / "mini_repo", dest)
    for p in dest.rglob("*.in"):
        p.rename(p.with_suffix(""))
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@x")
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(dest), *cmd], check=True, env=env, capture_output=True)
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture()
def swe_file(tmp_path: Path) -> tuple[Path, Path, str]:
    repos = tmp_path / "repos"
    repos.mkdir()
    commit = make_repo(repos)
    f = tmp_path / "swe.jsonl"
    f.write_text((FIX / "swebench.jsonl").read_text().replace("{commit}", commit))
    return f, repos, commit


def test_flywheel_loader_keeps_good_tasks_and_reports_broken_ones_by_id():
    load = load_tasks(FIX / "flywheel.jsonl")
    assert [t.id for t in load.tasks] == ["fw-clamp", "fw-pkg"]
    reasons = {e.task_id: e.reason for e in load.errors}
    assert set(reasons) == {"fw-badjson", "fw-noproblem", "fw-badcmd", "fw-missingfile", "fw-nohidden", "fw-clamp",
                            "fw-escape", "<line 10>"}
    assert "bad JSON" in reasons["fw-badjson"]
    assert "missing field 'problem'" in reasons["fw-noproblem"]
    assert "'no-such-test-runner' is not installed" in reasons["fw-badcmd"]
    assert "test_nothere.py" in reasons["fw-missingfile"]
    assert "test_gone.py" in reasons["fw-nohidden"]
    assert "duplicate" in reasons["fw-clamp"]
    assert "inside the workspace" in reasons["fw-escape"]
    assert "JSON object" in reasons["<line 10>"]
    lines = {e.task_id: e.line for e in load.errors}
    assert lines["fw-badcmd"] == 5 and lines["fw-clamp"] == 8
    t = load.tasks[0]
    assert t.fail_to_pass == ["test_hidden.py::test_high"] and t.solution and t.meta == {"note": "fixture"}


def test_humaneval_loader_builds_single_file_tasks():
    load = load_tasks(FIX / "humaneval.jsonl")
    assert [t.id for t in load.tasks] == ["HumanEval/0", "HumanEval/1"]
    assert {e.task_id for e in load.errors} == {"HumanEval/2", "HumanEval/3", "HumanEval/4"}
    t = load.tasks[0]
    assert t.files["solution.py"] == 'def add_one(x):\n    """Return x plus one."""\n'
    assert t.solution == {"solution.py": t.files["solution.py"] + "    return x + 1\n"}
    # graded by the standard-library runner, restored like a hidden file; the test sees the prompt's names
    assert t.test_command == "python runtests.py -q" and t.files["runtests.py"] == t.hidden_files["runtests.py"]
    assert "vars(_solution)" in t.hidden_files["test_solution.py"]
    assert t.fail_to_pass == ["test_solution.py::test_check"]
    assert load_tasks(FIX / "humaneval.jsonl", fmt="humaneval").tasks[1].meta["entry_point"] == "twice"


def test_swebench_loader_against_a_local_clone(swe_file):
    f, repos, commit = swe_file
    load = load_tasks(f, repos_dir=repos)
    assert [t.id for t in load.tasks] == ["acme__mini-1"]
    reasons = {e.task_id: e.reason for e in load.errors}
    assert "no local clone of 'acme/gone'" in reasons["acme__gone-2"]
    assert "is not in the repository" in reasons["acme__mini-3"]
    assert "not a JSON list" in reasons["acme__mini-4"]
    assert "bad JSON" in reasons["acme__mini-5"]
    t = load.tasks[0]
    assert t.commit == commit and Path(t.repo) == (repos / "acme__mini").resolve()
    assert t.fail_to_pass == ["tests/test_core.py::test_add"]  # decoded from a JSON string
    assert t.pass_to_pass == ["tests/test_core.py::test_mul"]
    assert t.test_patch.startswith("diff --git a/tests/test_core.py") and "return a + b" in t.meta["patch"]
    assert "return a - b" in original_file(t, "mini/core.py")
    # without repos_dir the repository cannot be found: reported, not raised
    assert len(load_tasks(f).errors) == 5


def test_task_base_dir_from_files_and_from_git_is_cached(tmp_path, swe_file):
    f, repos, _ = swe_file
    swe = load_tasks(f, repos_dir=repos).tasks[0]
    base = task_base_dir(swe, tmp_path / "cache")
    assert (base / "mini" / "core.py").read_text().startswith("def add(a, b):\n    return a - b")
    assert (base / "tests" / "test_core.py").is_file() and not (base / ".git").exists()
    assert task_base_dir(swe, tmp_path / "cache") == base
    fw = load_tasks(FIX / "flywheel.jsonl").tasks[1]
    b2 = task_base_dir(fw, tmp_path / "cache")
    assert (b2 / "pkg" / "calc.py").read_text() == fw.files["pkg/calc.py"]
    assert not (b2 / "tests" / "test_hidden.py").exists()  # hidden files only appear at grading
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([base.name, b2.name])


def test_save_and_load_round_trip(tmp_path):
    tasks = load_tasks(FIX / "flywheel.jsonl").tasks
    out = save_tasks(tasks, tmp_path / "out" / "t.jsonl")
    again = load_tasks(out, fmt="flywheel")
    assert again.errors == [] and again.tasks == tasks


def test_bad_arguments_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tasks(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="task format must be one of"):
        load_tasks(FIX / "flywheel.jsonl", fmt="csv")


def test_helpers():
    assert is_test_path("a/test_x.py") and is_test_path("x_test.py") and is_test_path("pkg/conftest.py")
    assert not is_test_path("testing.py") and not is_test_path("test_x.txt")
    assert file_of_test("tests/t.py::C::test_a[1-2]") == "tests/t.py"
    assert str(TaskLoadError("a", 3, "bad")) == "task 'a' (line 3): bad"
    bad = Task(id="x", problem="p", files={"a.py": "1"}, fail_to_pass=["a.py::t"])
    p = Path(save_tasks([bad], Path("/tmp") / f"fw-{os.getpid()}.jsonl"))
    rec = json.loads(p.read_text())
    assert rec["id"] == "x" and rec["limits"] == {"max_turns": None, "timeout_s": None}
    p.unlink()


def test_adversarial_lines_are_reported_not_raised(tmp_path):
    good = json.loads((FIX / "flywheel.jsonl").read_text().splitlines()[0])
    lines = [json.dumps(dict(good, id="lim", limits={"max_turns": "many"})),
             json.dumps(dict(good, id="lim2", limits={"timeout_s": -1})),
             json.dumps(dict(good, id="extra", bogus=1)),
             json.dumps(dict(good, id="files", files={"a.py": 3})),
             json.dumps(dict(good, id="f2p", fail_to_pass="test_hidden.py::test_high")),
             json.dumps(dict(good, id="ok", limits={"max_turns": 4, "timeout_s": 30}))]
    f = tmp_path / "t.jsonl"
    f.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe{not json\n\n   \n")
    load = load_tasks(f)
    assert [t.id for t in load.tasks] == ["ok"] and load.tasks[0].limits.max_turns == 4
    reasons = {e.task_id: e.reason for e in load.errors}
    assert "max_turns must be a positive integer" in reasons["lim"]
    assert "timeout_s must be a positive number" in reasons["lim2"]
    assert "unknown fields ['bogus']" in reasons["extra"]
    assert "map file paths to file contents" in reasons["files"]
    assert "not a JSON list" in reasons["f2p"]
    assert "bad JSON" in reasons["<line 7>"] and len(load.errors) == 6  # blank lines are skipped


def test_a_test_command_whose_module_is_not_installed_is_a_broken_task(tmp_path):
    """`python -m pytest` in an environment without pytest would grade every session 0 in silence."""
    line = {"id": "fw-nomod", "problem": "p", "files": {"a.py": "x = 1\n", "test_a.py": "def test_a():\n    pass\n"},
            "fail_to_pass": ["test_a.py::test_a"], "test_command": "python -m no_such_runner_xyz -q"}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "id": "fw-ok", "test_command": "python -m pytest"})
                    + "\n")
    load = load_tasks(path)
    assert [t.id for t in load.tasks] == ["fw-ok"]
    (err,) = load.errors
    assert err.task_id == "fw-nomod" and "no_such_runner_xyz" in err.reason and "cannot import" in err.reason
