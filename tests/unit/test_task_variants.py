"""The SWE-bench family's field variants load as tasks (tasks/variants.py, loaders.parse_swebench)."""

import json
import subprocess

from flywheel.tasks.loaders import load_tasks
from flywheel.tasks.repoenv import PYTEST_REQUIREMENT
from flywheel.tasks.variants import normalize, variant_of


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()


def _repo(tmp_path):
    repo = tmp_path / "clones" / "acme__mini"
    (repo / "mini").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "mini"\ndependencies = ["attrs"]\n')
    (repo / "mini" / "core.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_core.py").write_text("from mini.core import add\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "bug")
    bug = _git(repo, "rev-parse", "HEAD")
    _git(repo, "branch", "acme__mini.abc__1")  # SWE-smith: one branch per instance
    (repo / "mini" / "core.py").write_text("def add(a, b):\n    return a + b\n")
    _git(repo, "commit", "-qam", "fix")
    return repo, bug, _git(repo, "rev-parse", "HEAD")


def test_each_variant_loads_with_its_own_fields(tmp_path):
    repo, bug, fix = _repo(tmp_path)
    f2p = ["tests/test_core.py::test_add"]
    records = [
        {"instance_id": "sb-1", "repo": "acme/mini", "base_commit": bug, "patch": "", "test_patch": "",
         "problem_statement": "add", "FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": "[]",
         "version": "1.0", "environment_setup_commit": bug},
        {"instance_id": "gym-1", "repo": "acme/mini", "base_commit": bug, "patch": "", "test_patch": "",
         "problem_statement": "add", "FAIL_TO_PASS": f2p, "PASS_TO_PASS": [], "version": "1.0"},
        {"instance_id": "acme__mini.abc__1", "repo": "acme/mini", "patch": "diff --git a/x b/x\n",
         "FAIL_TO_PASS": f2p, "PASS_TO_PASS": [], "image_name": "swesmith/x", "problem_statement": "add"},
        {"repo_name": "acme/mini", "commit_hash": fix, "problem_statement": "add", "docker_image": "r2e/x",
         "expected_output_json": json.dumps({"tests/test_core.py::test_add": "PASSED"})},
        {"repo_name": "acme/mini", "commit_hash": fix, "problem_statement": "no tests"},
    ]
    assert [variant_of(r) for r in records] == ["swebench", "swe-gym", "swe-smith", "r2e-gym", "r2e-gym"]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    load = load_tasks(path, repos_dir=tmp_path / "clones")
    by_id = {t.id: t for t in load.tasks}
    assert set(by_id) == {"sb-1", "gym-1", "acme__mini.abc__1", f"acme/mini-{fix[:12]}"}
    assert [e.line for e in load.errors] == [5] and "expected_output_json" in load.errors[0].reason
    # SWE-bench with environment_setup_commit: its own environment, from its pyproject at that commit
    assert by_id["sb-1"].python_env["requirements"] == ["attrs", PYTEST_REQUIREMENT]
    assert by_id["gym-1"].python_env is None  # no environment_setup_commit: the run's Python, as before
    smith = by_id["acme__mini.abc__1"]
    assert smith.commit == "acme__mini.abc__1" and smith.meta["bug_patch"].startswith("diff")
    r2e = by_id[f"acme/mini-{fix[:12]}"]
    assert r2e.commit == f"{fix}~1" and r2e.meta["fix_commit"] == fix and r2e.fail_to_pass == f2p


def test_normalize_leaves_other_records_alone():
    d = {"id": "x", "problem": "p"}
    assert normalize(d) == d and variant_of(d) is None
