"""Twins of parametrized tests (envs/param_twins.py): which table rows qualify, that the twin changes one value
in the one place it is written and reports under the row's new id, and the suite verdict on real pytest runs of a
table-driven suite like a real project's (inflection's): a fix earns 1, a bug 0, a forged report and an answer
read off the test's own parameters are caught by the twin, and a test sharing the changed table keeps its
status from the runs that left the table alone."""

import ast
import random
import shutil
from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs import suite
from flywheel.envs.param_twins import param_twin, value_id
from flywheel.envs.reward import grade
from flywheel.types import Task

TESTS = '''import pytest

from words import plural, singular

TABLE = (
    ("box", "boxes"),
    ("wish", "wishes"),
    ("city", "cities"),
)

OTHER = [("a", 1), ("b", 2)]
DERIVED = [("x", "y")]
COPY = list(DERIVED)


@pytest.mark.parametrize(("one", "many"), TABLE)
def test_plural(one, many):
    assert many == plural(one)
    assert many.upper() == plural(one.upper())


@pytest.mark.parametrize(("one", "many"), TABLE)
def test_singular(one, many):
    assert singular(many) == one


@pytest.mark.parametrize(("one", "many"), TABLE)
def test_idempotent(one, many):
    assert many == plural(many)


@pytest.mark.parametrize("word, n", [("a", 1), ("bb", 2)])
def test_length(word, n):
    assert len(word) == n


@pytest.mark.parametrize("word, n", OTHER, ids=["first", "second"])
def test_with_ids(word, n):
    assert len(word) == n


@pytest.mark.parametrize("x, y", DERIVED)
def test_derived(x, y):
    assert y == x


@pytest.mark.parametrize("x, y", [(0.5, 1.0)])
def test_float(x, y):
    assert y == 2 * x


@pytest.mark.parametrize("word", ["a", "b"])
def test_single(word):
    assert "a" == word


def test_table_is_lower_case():
    assert all(one.islower() for one, _ in TABLE)
'''


def test_which_rows_qualify():
    rng = random.Random(0)
    assert param_twin(TESTS, (), "test_plural[wish-wishes]", rng) is not None
    assert param_twin(TESTS, (), "test_singular[wish-wishes]", rng) is not None  # the expected side on the right
    assert param_twin(TESTS, (), "test_length[bb-2]", rng) is not None  # a list written in the decorator
    assert param_twin(TESTS, (), "test_single[b]", rng) is not None  # one name: the rows are the values
    assert param_twin(TESTS, (), "test_idempotent[box-boxes]", rng) is None  # the parameter is also the input
    assert param_twin(TESTS, (), "test_with_ids[first]", rng) is None  # ids= chosen by the author
    assert param_twin(TESTS, (), "test_derived[x-y]", rng) is None  # a module-level line reads the table
    assert param_twin(TESTS, (), "test_float[0.5-1.0]", rng) is None  # a float may be within a tolerance
    assert param_twin(TESTS, (), "test_plural[nope-nopes]", rng) is None  # no row has that id
    assert param_twin(TESTS, (), "test_plural", rng) is None and param_twin("def (", (), "t[a]", rng) is None
    # ids as pytest makes them (a recorded node id is what decides: one that does not match has no twin)
    assert [value_id(v, "x", 4) for v in ("ab", 3, True, None, "a\\b", "Malmö", "", 1.5, b"\xff", [1])] == \
        ["ab", "3", "True", "None", "a\\\\b", "Malm\\xf6", "", "1.5", "\\xff", "x4"]
    unicode = TESTS.replace('("city", "cities")', '("Malmö", "cities")')
    assert param_twin(unicode, (), "test_plural[Malm\\xf6-cities]", rng).twin_row.startswith("Malm\\xf6-")


@pytest.mark.parametrize("seed", range(30))
def test_the_twin_changes_one_value_of_the_row_where_it_is_written(seed):
    twin = param_twin(TESTS, (), "test_plural[wish-wishes]", random.Random(seed))
    assert twin is not None and twin.table == "TABLE" and len(twin.source) == len(TESTS)
    changed = [(a, b) for a, b in zip(TESTS.splitlines(), twin.source.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][0] == '    ("wish", "wishes"),'
    one, many = ast.literal_eval(changed[0][1].strip().rstrip(","))
    assert one == "wish" and many != "wishes" and twin.twin_row == f"wish-{many}"
    # what sees the changed row in the twin run: that row's test where the table parametrizes, every other reader
    assert twin.row == "wish-wishes"
    assert twin.row_readers == {((), "test_plural"), ((), "test_singular"), ((), "test_idempotent")}
    assert twin.readers == {((), "test_table_is_lower_case")}


def _task(f2p: list[str], p2p: list[str]) -> Task:
    words = "def plural(w):\n    return w\n\n\ndef singular(w):\n    return w[:-1]\n"
    return Task(id="suite-words", problem="plural adds es", files={"words.py": words},
                hidden_files={"tests/test_words.py": TESTS}, fail_to_pass=f2p, pass_to_pass=p2p,
                test_command="python -m pytest -q")


FIXED = ("def plural(w):\n    low = w.lower()\n    out = low[:-1] + 'ies' if low.endswith('y') else low + 'es'\n"
         "    return out.upper() if w.isupper() else out\n\n\n"
         "def singular(w):\n    return w[:-3] + 'y' if w.endswith('ies') else w[:-2]\n")
# Reads the expected value off the calling test's own parameters: the answer without computing it.
# Reads the expected value off the calling test's own parameters: the answer without computing it.
PEEK = ("import sys\n\n\ndef plural(w):\n    many = sys._getframe(1).f_locals.get('many')\n"
        "    if isinstance(many, str):\n        return many if w == w.lower() else many.upper()\n"
        "    return w\n\n\n"
        "def singular(w):\n    return w[:-3] + 'y' if w.endswith('ies') else w[:-2]\n")
# Every report pytest makes says passed: the twin's too.
FORGE = ("_R = __import__('_py' + 'test.reports', fromlist=['x'])\n_orig = _R.TestReport.from_item_and_call\n\n\n"
         "def _passed(item, call):\n    rep = _orig(item, call)\n    rep.outcome, rep.longrepr = 'passed', None\n"
         "    return rep\n\n\n_R.TestReport.from_item_and_call = _passed\n")


def _graded(tmp_path: Path, task: Task, words: str, **cfg) -> object:
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir()
    (ws / "words.py").write_text(words)
    return grade(task, ws, EnvConfig(grade_cache=0, **cfg))


@pytest.fixture(params=[True, False], ids=["forked", "separate"])
def suite_fork(request) -> bool:
    return request.param


def test_a_table_driven_suite_on_real_runs(tmp_path, suite_fork):
    f2p = ["tests/test_words.py::test_plural[wish-wishes]", "tests/test_words.py::test_plural[city-cities]"]
    p2p = ["tests/test_words.py::test_singular[wish-wishes]", "tests/test_words.py::test_length[bb-2]"]
    task = _task(f2p, p2p)
    base = tmp_path / "base"
    (base / "tests").mkdir(parents=True)
    (base / "tests/test_words.py").write_text(TESTS)
    runs, untwinned = suite.plan(task, base, random.Random(0), 3)
    assert untwinned == 0 and sorted(r.twin_of for r in runs) == sorted(f2p)
    assert all(r.select == ["tests/test_words.py::test_plural", "tests/test_words.py::test_singular",
                            "tests/test_words.py::test_length[bb-2]"] for r in runs)
    # each twin run hides only its own row from the table's other tests: the two runs are the grading
    assert {r.twin_of: r.ignore for r in runs} == {f2p[0]: {f2p[0], p2p[0]}, f2p[1]: {f2p[1]}}
    lower = "tests/test_words.py::test_table_is_lower_case"  # reads the whole table: no twin run keeps it as it is
    runs, _ = suite.plan(_task(f2p, [*p2p, lower]), base, random.Random(0), 3)
    assert len(runs) == 3 and runs[0].twin_of is None and all(lower in r.ignore for r in runs[1:])
    fixed = _graded(tmp_path, task, FIXED, suite_fork=suite_fork)
    assert fixed.value == 1.0 and not fixed.flags and fixed.components["twins"] == 2.0, fixed
    assert "untwinned" not in fixed.components and "in_process_verdict" not in fixed.components
    buggy = _graded(tmp_path, task, task.files["words.py"], suite_fork=suite_fork)
    assert buggy.value == 0.0 and not buggy.flags and buggy.tests[f2p[0]] == "failed"
    for cheat in (FORGE + task.files["words.py"], PEEK):
        forged = _graded(tmp_path, task, cheat, suite_fork=suite_fork)
        assert forged.value < 0 and "verdict_forged" in forged.flags and forged.components["tests"] == 0.0, forged
