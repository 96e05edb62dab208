"""Mined tests that compute their expected value get one as a literal from the reference tree, and with it a twin
(envs/expected.py): mined from a project written here, built in its own environment, graded through the real path.

Before: no FAIL_TO_PASS test of these tasks has a literal to change, so the guarded in-process path graded them
(`in_process_verdict`). After: the suite verdict with every FAIL_TO_PASS test twinned, and code that forges the
report is caught by the twin (`verdict_forged`), which the guard's heuristics are not needed for.
A second project's tests assert only truths (`assert is_sorted(xs)`, `... is None`): they have no expected value to
change at all, and their twins flip one statement's truth (envs/twins.py `flips`), with the same outcome.
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


FLAGS = '''"""Predicates whose tests assert truths."""


def is_sorted(xs):
    for a, b in zip(xs, xs[1:]):
        if a > b:
            return False
    return True


def first_even(xs):
    for x in xs:
        if x % 2 == 0:
            return x
    return None
'''
FLAG_TESTS = '''from calc.core import first_even, is_sorted


def test_sorted():
    assert is_sorted([1, 2, 2, 5])
    assert not is_sorted([3, 1, 2])


def test_first_even():
    assert first_even([1, 3]) is None
    assert first_even([1, 4, 6]) is not None
'''


def _mine(tmp_path_factory, core: str, tests: str):
    """(tasks, envs dir, scratch dir) mined from a project `calc` with that `calc/core.py` and `tests/test_core.py`."""
    root = tmp_path_factory.mktemp("calc-src")
    (root / "calc").mkdir()
    (root / "calc" / "__init__.py").write_text("")
    (root / "calc" / "core.py").write_text(core)
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(tests)
    (root / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "0.1"\n')
    envs = tmp_path_factory.mktemp("envs")
    tasks, report = mine_directory("calc-0.1", root, tmp_path_factory.mktemp("mine"), envs, max_tasks=4, seed=0)
    assert tasks, report
    return tasks, envs, tmp_path_factory.mktemp("scratch")


@pytest.fixture(scope="module")
def mined(tmp_path_factory):
    return _mine(tmp_path_factory, CORE, TESTS)


@pytest.fixture(scope="module")
def mined_flags(tmp_path_factory):
    return _mine(tmp_path_factory, FLAGS, FLAG_TESTS)


def _forged_and_honest(task, envs, scratch, workspace):
    """The grades of the task's bugged tree under a patched report (every test passed) and of the reference fix."""
    cfg = EnvConfig(grade_cache=0, python_envs_dir=str(envs))
    shutil.copytree(task_base_dir(task, scratch / "cache"), workspace, symlinks=True)
    (path, fixed), = task.solution.items()
    bugged = (workspace / path).read_text()
    write_files(workspace, {path: REPORT_PATCH + bugged})  # every test reported passed, nothing fixed
    forged = grade(task, workspace, cfg)
    write_files(workspace, {path: fixed})
    return forged, grade(task, workspace, cfg)


def test_computed_expectations_become_twinned_literals(mined):
    tasks, envs, scratch = mined
    cfg = EnvConfig(grade_cache=0, python_envs_dir=str(envs))
    before = [verify_task(t, cfg, scratch / "before") for t in tasks]
    assert all(r.ok for r in before), before
    assert {r.verdict for r in before} == {"in-process"}  # nothing to twin in the file as written
    new, line = materialise_tasks(tasks, str(envs))
    assert line.startswith("expectations: ") and "had one already" in line
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
    task, outcome = materialise_task(tasks[0], str(envs), scratch)
    assert outcome.materialised and not outcome.error, outcome
    forged, honest = _forged_and_honest(task, envs, scratch, tmp_path / "ws")
    assert forged.value <= 0 and "verdict_forged" in forged.flags and forged.components.get("suite_verdict"), forged
    assert honest.value == 1.0 and not honest.flags and "untwinned" not in honest.components, honest


def test_tests_that_assert_truths_are_twinned_by_a_flip(mined_flags, tmp_path):
    """Nothing to materialise (no equality at all): every FAIL_TO_PASS test is twinned as mined, by flipping one of
    its statements, and as a flip is weaker than a changed value the guarded path grades the task too
    (`suite+guard`); the reference fix earns 1 with no flag, a forged report is caught by the flipped twin."""
    tasks, envs, scratch = mined_flags
    cfg = EnvConfig(grade_cache=0, python_envs_dir=str(envs))
    new, line = materialise_tasks(tasks, str(envs))
    assert not any(t.meta.get("materialised_expectations") for t in new), line
    results = [verify_task(t, cfg, scratch / "verify") for t in tasks]
    assert all(r.ok for r in results) and {r.verdict for r in results} == {"suite+guard"}, results
    for i, task in enumerate(tasks):
        forged, honest = _forged_and_honest(task, envs, scratch, tmp_path / f"ws{i}")
        assert forged.value <= 0 and "verdict_forged" in forged.flags and forged.components["twins"] >= 1, forged
        assert honest.value == 1.0 and not honest.flags and "untwinned" not in honest.components, honest
        assert honest.components["flip_twins"] >= 1 and honest.components["guarded_untwinned"] == 1.0, honest
