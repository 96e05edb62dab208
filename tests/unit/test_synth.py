"""Synthetic bug-fix tasks: verified, deterministic, varied, split by function, difficulty in the statement."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flywheel.tasks.loaders import load_tasks
from flywheel.tasks.synth import (
    DIFFICULTIES,
    MUTATIONS,
    RUNNER_FILE,
    TEMPLATES,
    generate_tasks,
    oracle_actions,
    run_tests_inprocess,
    split_of,
    templates_for,
    write_tasks,
)


@pytest.fixture(scope="module")
def train() -> list:
    return generate_tasks(150, seed=0, split="train")


def _apply(task, calls) -> dict[str, str]:
    files = dict(task.files)
    for c in calls:
        if c.name == "str_replace":
            text = files[c.arguments["path"]]
            assert text.count(c.arguments["old"]) == 1
            files[c.arguments["path"]] = text.replace(c.arguments["old"], c.arguments["new"])
        elif c.name == "write":
            files[c.arguments["path"]] = c.arguments["content"]
    return files


def test_every_task_is_verified_original_passes_mutant_fails(train):
    for t in train[:60]:
        module = t.meta["module"][:-3]
        for path, src in t.hidden_files.items():
            if path == RUNNER_FILE:
                continue
            good = run_tests_inprocess(module, t.solution[t.meta["module"]], src)
            bad = run_tests_inprocess(module, t.files[t.meta["module"]], src)
            assert good and all(good.values()), (t.id, path)
            assert {f"{path}::{k}" for k, ok in bad.items() if not ok} == {x for x in t.fail_to_pass if x.startswith(path + "::")}
        assert t.fail_to_pass
        assert set(t.fail_to_pass).isdisjoint(t.pass_to_pass)


def test_real_pytest_agrees_with_in_process_verification(tmp_path, train):
    """One pytest process over several task dirs (batched), so the in-process check is not the only one."""
    tasks = train[:2]
    for k, t in enumerate(tasks):
        for which in ("bug", "fix"):
            d = tmp_path / f"t{k}_{which}"
            d.mkdir()
            files = dict(t.files, **t.hidden_files)
            if which == "fix":
                files.update(t.solution)
            for rel, text in files.items():
                (d / rel).write_text(text)
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(d),
                                "-rA", str(d)], capture_output=True, text=True, cwd=d,
                               env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin:/bin"})
            failed = {line.split()[1].split("::", 1)[1] for line in r.stdout.splitlines() if line.startswith("FAILED")}
            failed_ids = {x for x in (t.fail_to_pass + t.pass_to_pass) if x.split("::")[1] in failed}
            if which == "fix":
                assert r.returncode == 0, r.stdout[-2000:]
            else:
                assert failed_ids == set(t.fail_to_pass), r.stdout[-2000:]


def test_generation_is_fast_deterministic_and_varied():
    t0 = time.perf_counter()
    a = generate_tasks(200, seed=7)
    elapsed = time.perf_counter() - t0
    assert elapsed < 20, elapsed  # ~1 s for 200 here when the machine is idle
    b = generate_tasks(200, seed=7)
    assert [t.files for t in a] == [t.files for t in b] and [t.problem for t in a] == [t.problem for t in b]
    c = generate_tasks(20, seed=8)
    assert [t.files for t in c] != [t.files for t in a[:20]]
    assert len({t.id for t in a}) == 200
    assert {t.meta["mutation"] for t in a} == set(MUTATIONS)
    assert {t.meta["difficulty"] for t in a} == set(DIFFICULTIES)
    assert len({t.meta["function"] for t in a}) >= 25
    assert len({t.meta["name"] for t in a}) >= 40
    assert len({t.files[t.meta["module"]] for t in a}) >= 185  # names and constants randomised


def test_splits_never_share_a_function():
    tr = generate_tasks(200, seed=1, split="train")
    ho = generate_tasks(100, seed=1, split="heldout")
    f_tr, f_ho = {t.meta["function"] for t in tr}, {t.meta["function"] for t in ho}
    assert f_tr and f_ho and f_tr.isdisjoint(f_ho)
    n_tr, n_ho = {t.meta["name"] for t in tr}, {t.meta["name"] for t in ho}
    assert n_tr.isdisjoint(n_ho)  # not even a function name in common
    assert {t.meta["split"] for t in ho} == {"heldout"}
    ids = {t.id for t in tr} | {t.id for t in ho}
    assert len(ids) == 300
    assert len(templates_for("heldout")) == sum(split_of(i) == "heldout" for i in range(len(TEMPLATES))) >= 8
    with pytest.raises(ValueError, match="split must be"):
        generate_tasks(1, split="test")


def test_difficulty_levels_shape_the_statement():
    easy = generate_tasks(30, seed=2, difficulty="easy")
    for t in easy:
        mod = t.meta["module"]
        assert t.problem.startswith(f"In `{mod}`, function `{t.meta['name']}`")
        old, new = t.meta["edit"]  # the shortest whole-token edit, no longer than the changed line
        assert f"`{old}` should be `{new}`" in t.problem and len(old) <= len(t.meta["old"][0].strip())
        assert t.files[mod].count(old) == 1
        assert t.files[mod].replace(old, new, 1) == t.solution[mod]
        calls = oracle_actions(t)  # the oracle's edit is exactly what the statement says
        assert [c.name for c in calls] == ["view", "str_replace", "submit"]
        assert (calls[1].arguments["old"], calls[1].arguments["new"]) == (old, new)
        assert len(t.files[mod].splitlines()) <= 12
        assert len(t.problem) < 240
    medium = generate_tasks(20, seed=2, difficulty="medium")
    for t in medium:
        assert t.meta["module"] in t.problem and "should return" in t.problem and "should be" not in t.problem
    hard = generate_tasks(20, seed=2, difficulty="hard")
    for t in hard:
        assert t.meta["module"] not in t.problem and "should return" in t.problem
        tree = ast.parse(t.files[t.meta["module"]])
        assert sum(isinstance(n, ast.FunctionDef) for n in tree.body) == 2


def test_oracle_edit_reproduces_the_solution(train):
    for t in train:
        assert _apply(t, oracle_actions(t)) == dict(t.files, **t.solution), t.id


def test_write_tasks_and_cli_round_trip(tmp_path):
    from flywheel.cli import main

    out = tmp_path / "t.jsonl"
    assert main(["tasks", "synth", "--n", "25", "--seed", "3", "--out", str(out), "--split", "heldout",
                 "--difficulty", "medium"]) == 0
    load = load_tasks(out)
    assert load.errors == [] and len(load.tasks) == 25
    assert load.tasks == generate_tasks(25, seed=3, split="heldout", difficulty="medium")
    assert main(["tasks", "check", str(out)]) == 0
    assert main(["tasks", "check", str(Path(__file__).parents[1] / "fixtures" / "tasks" / "flywheel.jsonl")]) == 1
    tasks = write_tasks(tmp_path / "w.jsonl", 3, seed=0, difficulty="easy")
    assert load_tasks(tmp_path / "w.jsonl").tasks == tasks


def test_bad_arguments():
    with pytest.raises(ValueError, match="difficulty must be one of"):
        generate_tasks(3, difficulty="extreme")
    with pytest.raises(ValueError, match="non-negative"):
        generate_tasks(-1)
    assert generate_tasks(0) == []
    t = generate_tasks(1)[0]
    t.solution = None
    with pytest.raises(ValueError, match="no `solution`"):
        oracle_actions(t)


def test_tasks_are_identical_across_processes_and_hash_seeds():
    code = ("import hashlib, json; from flywheel.tasks.synth import generate_tasks; "
            "from flywheel.tasks.loaders import task_to_dict; "
            "ts = generate_tasks(30, seed=4) + generate_tasks(10, seed=4, split='heldout'); "
            "print(hashlib.sha256(json.dumps([task_to_dict(t) for t in ts]).encode()).hexdigest())")
    import hashlib
    import json
    import os

    from flywheel.tasks.loaders import task_to_dict

    ts = generate_tasks(30, seed=4) + generate_tasks(10, seed=4, split="heldout")
    here = hashlib.sha256(json.dumps([task_to_dict(t) for t in ts]).encode()).hexdigest()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONHASHSEED="12345")).stdout.strip()
    assert out == here


def test_ids_are_unique_across_settings():
    ids = [t.id for d in (None, *DIFFICULTIES) for sp in ("train", "heldout") for t in generate_tasks(3, 0, sp, d)]
    assert len(set(ids)) == len(ids) == 24
    assert ids[0] == "synth-train-0-mix-00000"
