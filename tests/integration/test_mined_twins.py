"""Mined tests that compute their expected value get one as a literal from the reference tree, and with it a twin
(envs/expected.py): mined from a project written here, built in its own environment, graded through the real path.

Before: no FAIL_TO_PASS test of these tasks has a literal to change, so the guarded in-process path graded them
(`in_process_verdict`). After: the suite verdict with every FAIL_TO_PASS test twinned, and code that forges the
report is caught by the twin (`verdict_forged`), which the guard's heuristics are not needed for.
"""

import shutil

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.expected import materialise_task, materialise_tasks
from flywheel.envs.reward import grade
from flywheel.envs.verify import verify_task
from flywheel.tasks.loaders import load_tasks, save_tasks, task_base_dir, write_files
from flywheel.tasks.mine import mine_directory

CORE = '''"""Helpers whose tests compute what they expect."""


def scale(xs, k):
    out = []
    for x in xs:
        out.append(x * k)
    return out


def initials(names):
    letters = []
    for name in names:
        letters.append(name[0].upper())
    return "".join(letters)
'''
TESTS = '''from calc.core import initials, scale


def test_scale():
    xs = [1, 2, 3]
    assert scale(xs, 2) == [x + x for x in xs]


def test_initials():
    names = "ada lovelace".split()
    assert initials(names) == "ada"[0].upper() + "lovelace"[0].upper()
'''
REPORT_PATCH = ("_R = __import__('_py' + 'test.reports', fromlist=['x'])\n_made = _R.TestReport.from_item_and_call\n\n\n"
                "def _passed(item, call):\n    rep = _made(item, call)\n    rep.outcome, rep.longrepr = 'passed', None\n"
                "    return rep\n\n\n_R.TestReport.from_item_and_call = _passed\n")


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    root = tmp_path_factory.mktemp("calc-src")
    (root / "calc").mkdir()
    (root / "calc" / "__init__.py").write_text("")
    (root / "calc" / "core.py").write_text(CORE)
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(TESTS)
    (root / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "0.1"\n')
    envs = tmp_path_factory.mktemp("envs")
    tasks, report = mine_directory("calc-0.1", root, tmp_path_factory.mktemp("mine"), envs, max_tasks=4, seed=0)
    assert tasks, report
    return tasks, envs, tmp_path_factory.mktemp("scratch")


def test_computed_expectations_become_twinned_literals(mined):
    tasks, envs, scratch = mined
    cfg = EnvConfig(grade_cache=0, python_envs_dir=str(envs))
    before = [verify_task(t, cfg, scratch / "before") for t in tasks]
    assert all(r.ok for r in before), before
    assert {r.verdict for r in before} == {"in-process"}  # nothing to twin in the file as written
    new, line = materialise_tasks(tasks, str(envs))
    assert line.startswith("expectations: ") and "had a twin already" in line
    done = [t for t in new if t.meta.get("materialised_expectations")]
    assert done, line
    for t in done:
        (path, text), = t.hidden_files.items()
        assert path == "tests/test_core.py" and text != TESTS
        assert "== [2, 4, 6]" in text or "== 'AL'" in text
    after = [verify_task(t, cfg, scratch / "after") for t in done]
    assert all(r.ok for r in after) and {r.verdict for r in after} == {"suite"}, after
    saved = scratch / "t.jsonl"
    save_tasks(new, saved)
    assert [t.hidden_files for t in load_tasks(saved).tasks] == [t.hidden_files for t in new]


def test_a_forged_report_is_caught_by_the_materialised_twin(mined, tmp_path):
    tasks, envs, scratch = mined
    cfg = EnvConfig(grade_cache=0, python_envs_dir=str(envs))
    task, outcome = materialise_task(tasks[0], str(envs), scratch)
    assert outcome.materialised and not outcome.error, outcome
    ws = tmp_path / "ws"
    shutil.copytree(task_base_dir(task, scratch / "cache"), ws, symlinks=True)
    (path, fixed), = task.solution.items()
    bugged = (ws / path).read_text()
    write_files(ws, {path: REPORT_PATCH + bugged})  # every test reported passed, nothing fixed
    forged = grade(task, ws, cfg)
    assert forged.value <= 0 and "verdict_forged" in forged.flags and forged.components.get("suite_verdict"), forged
    write_files(ws, {path: fixed})
    honest = grade(task, ws, cfg)
    assert honest.value == 1.0 and not honest.flags and "untwinned" not in honest.components, honest
