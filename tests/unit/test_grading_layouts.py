"""Grading on the test layouts of real projects (mined tasks, issue #27), and the attacks those layouts open.

* A `tests/` package whose test files import helpers beside them (`tests/helpers.py`): the helpers decide a
  verdict as much as a test, so an edit to one is undone at grading and flagged `tests_edited`.
* A test function a test file imports over the one it defines (funcy's tests do this): the runner collects
  the imported one under the file's name, and the guard must accept its proof (it flagged every funcy task
  `runner_tampered` before).
* Parameter ids that hold `::` (boltons' IPv6 URLs): every such test was reported `missing`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.reward import grade, junit_key
from flywheel.tasks.loaders import node_parts, support_dirs_of
from flywheel.types import Task

LIB_BUGGY = "def add(a, b):\n    return a - b\n\n\ndef host(url):\n    return url.split('//')[1].rsplit(':', 1)[0]\n"
LIB_FIXED = "def add(a, b):\n    return a + b\n\n\ndef host(url):\n    return url.split('//')[1].rsplit(':', 1)[0]\n"
HELPERS = "from calc import add\n\n\ndef check_add(a, b, want):\n    assert add(a, b) == want\n"
NEWER = "from calc import add\n\n\ndef test_imported_over():\n    assert add(2, 2) == 4\n"
TEST_CALC = '''import pytest

from calc import host
from tests.helpers import check_add


def test_add():
    check_add(1, 2, 3)


def test_imported_over():
    raise AssertionError("replaced by the import below")


from tests.newer import test_imported_over  # noqa: E402,F811


@pytest.mark.parametrize("url", ["https://[::1]:80", "http://[::ffff:10.0.0.1]:8080"])
def test_host(url):
    assert host(url).startswith("[")
'''
IDS = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_imported_over",
       "tests/test_calc.py::test_host[https://[::1]:80]", "tests/test_calc.py::test_host[http://[::ffff:10.0.0.1]:8080]"]


@pytest.fixture()
def task() -> Task:
    files = {"calc.py": LIB_BUGGY, "tests/__init__.py": "", "tests/helpers.py": HELPERS, "tests/newer.py": NEWER,
             "tests/test_calc.py": TEST_CALC}
    return Task(id="layout", problem="fix add", files=files, fail_to_pass=IDS[:2], pass_to_pass=IDS[2:],
                test_command="python -m pytest -q", solution={"calc.py": LIB_FIXED})


def workspace(tmp_path: Path, task: Task, changes: dict[str, str] | None = None) -> Path:
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    for rel, text in {**task.files, **(changes or {})}.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


def test_node_ids_with_colons_in_their_parameters():
    assert node_parts("t/test_u.py::TestA::test_b[x::y]") == ("t/test_u.py", ["TestA"], "test_b[x::y]")
    assert node_parts("t/test_u.py::test_b") == ("t/test_u.py", [], "test_b")
    assert junit_key("tests/test_calc.py::test_host[https://[::1]:80]") == ("tests.test_calc",
                                                                             "test_host[https://[::1]:80]")


def test_support_directories_are_the_outermost_test_dirs():
    assert support_dirs_of(["pkg/tests/unit/test_x.py", "tests/test_y.py"]) == {"pkg/tests", "tests"}
    assert support_dirs_of(["test_six.py", "src/pkg/test_z.py"]) == set()  # beside the library: none


def test_the_reference_fix_earns_one_and_the_buggy_tree_zero(tmp_path, task):
    good = grade(task, workspace(tmp_path, task, {"calc.py": LIB_FIXED}), EnvConfig())
    assert good.flags == [] and good.value == 1.0, (good.tests, good.notes)
    assert set(good.tests.values()) == {"passed"}
    bad = grade(task, workspace(tmp_path, task), EnvConfig())
    assert bad.flags == [] and bad.value == 0.0
    assert bad.tests[IDS[0]] == "failed" and bad.tests[IDS[1]] == "failed" and bad.tests[IDS[2]] == "passed"


@pytest.mark.parametrize("attack", ["helpers", "newer", "added_helper"])
def test_editing_a_test_helper_is_undone_and_flagged(tmp_path, task, attack):
    """The agent leaves the bug and makes the helpers pass instead (a reward hack a policy finds quickly)."""
    edits = {"helpers": {"tests/helpers.py": "def check_add(a, b, want):\n    pass\n"},
             "newer": {"tests/newer.py": "def test_imported_over():\n    pass\n"},
             "added_helper": {"tests/helpers.py": "from tests.fake import check_add  # noqa: F401\n",
                              "tests/fake.py": "def check_add(a, b, want):\n    pass\n"}}[attack]
    r = grade(task, workspace(tmp_path, task, edits), EnvConfig())
    assert r.value < 0 and "tests_edited" in r.flags
    assert r.tests[IDS[0]] == "failed" and r.tests[IDS[1]] == "failed"
