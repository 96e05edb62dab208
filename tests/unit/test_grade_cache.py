"""The grade cache: hidden-test results reused only for a byte-identical restored tree of the same task."""

from __future__ import annotations

import os
import shutil

import pytest
from test_reward import FIXED, workspace
from test_tasks import FIX

from flywheel.config import EnvConfig
from flywheel.envs.grade_cache import GRADE_CACHE, GradeCache, tree_digest
from flywheel.envs.reward import grade
from flywheel.tasks.loaders import load_tasks


@pytest.fixture()
def task():
    return load_tasks(FIX / "flywheel.jsonl").tasks[0]


def test_the_digest_sees_content_names_kinds_and_the_exec_bit(tmp_path):
    root = tmp_path / "t"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    first = tree_digest(root)
    assert first == tree_digest(root)
    changes = [
        lambda: (root / "pkg" / "a.py").write_text("x = 2\n"),
        lambda: (root / "pkg" / "a.py").chmod(0o755),
        lambda: (root / "pkg" / "a.py").rename(root / "pkg" / "b.py"),
        lambda: (root / "empty").mkdir(),
        lambda: os.symlink("pkg/a.py", root / "link"),
        lambda: (root / "pkg" / "a.py").write_text("x = 1\n "),
    ]
    seen = {first}
    for change in changes:
        shutil.rmtree(root)
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "a.py").write_text("x = 1\n")
        assert tree_digest(root) == first
        change()
        seen.add(tree_digest(root))
    assert len(seen) == len(changes) + 1
    os.mkfifo(root / "fifo")
    assert tree_digest(root) is None  # nothing to key on: never cached


def test_the_cache_is_a_bounded_lru_that_copies_values():
    cache = GradeCache()
    cache.put("a", ({"x": 1.0}, {("m", "t"): "passed"}), capacity=2)
    cache.put("b", ({}, {}), capacity=2)
    assert cache.get("a") == ({"x": 1.0}, {("m", "t"): "passed"})
    cache.put("c", ({}, {}), capacity=2)  # evicts b, the least recently used
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    got = cache.get("a")
    got[0]["x"] = 5.0
    assert cache.get("a")[0] == {"x": 1.0}
    cache.put("d", ({}, {}), capacity=0)
    assert cache.get("d") is None and cache.get(None) is None
    assert (cache.hits, cache.misses) == (5, 3)


def test_an_identical_tree_reuses_the_result_and_a_different_one_runs(tmp_path, task):
    cfg = EnvConfig()
    first = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED}), cfg)
    again = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED}), cfg)
    assert "tests_cached" not in first.components and again.components["tests_cached"] == 1.0
    assert (again.value, again.tests) == (first.value, first.tests) and first.value == 1.0
    # one byte more is another tree: its tests run
    other = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED + "\n"}), cfg)
    assert "tests_cached" not in other.components and other.value == 1.0
    # an edited test file is restored before the key is taken, so the tree is the fixed one; the flag is the
    # session's own, computed for it
    cheat = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED, "test_calc.py": "x = 1\n"}), cfg)
    assert cheat.components["tests_cached"] == 1.0 and cheat.flags == ["tests_edited"] and cheat.value == 0.0
    # off: every grading runs
    off = grade(task, workspace(tmp_path, task, **{"calc.py": FIXED}), EnvConfig(grade_cache=0))
    assert "tests_cached" not in off.components and off.value == 1.0


def test_a_timed_out_run_is_not_kept(tmp_path, task):
    slow = "import time\ntime.sleep(30)\n" + FIXED
    cfg = EnvConfig(grade_timeout_s=1.0)
    for _ in range(2):
        r = grade(task, workspace(tmp_path, task, **{"calc.py": slow}), cfg)
        assert r.components.get("timed_out") == 1.0 and "tests_cached" not in r.components
    assert GRADE_CACHE.hits == 0
