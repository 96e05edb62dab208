"""Check programs (envs/checks.py, tasks/checker.py): the task's test code runs in a sandbox of its own and the
candidate's function answers each call over plain data in another. Real sandboxes throughout."""

import json
import shutil
from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.reward import grade
from flywheel.tasks.callee import decode
from flywheel.tasks.checker import CandidateError, answer
from flywheel.tasks.loaders import BrokenTask, parse_flywheel, parse_humaneval, task_base_dir

PROBLEM = {  # a check program: random inputs, answers computed by the prompt's helper, one tolerance assert
    "task_id": "Relay/0",
    "prompt": ('import math\n\n\ndef _sq(x):\n    return x * x\n\n\ndef norm(v: list) -> float:\n'
               '    """The Euclidean norm of v."""\n'),
    "canonical_solution": "    return math.sqrt(sum(_sq(x) for x in v))\n",
    "test": ("def check(candidate):\n    import random\n    for _ in range(30):\n"
             "        v = [random.randint(-9, 9) for _ in range(3)]\n"
             "        assert abs(candidate(v) - math.sqrt(sum(_sq(x) for x in v))) < 1e-9\n"
             "    assert norm([3, 4]) == 5.0\n"),
    "entry_point": "norm",
}


def _grade(task, solution: str, tmp_path: Path, cfg: EnvConfig | None = None):
    ws = tmp_path / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(task_base_dir(task, tmp_path / "cache"), ws)
    (ws / "solution.py").write_text(solution, encoding="utf-8")
    return grade(task, ws, cfg or EnvConfig(grade_cache=0))


@pytest.fixture(scope="module")
def task():
    t = parse_humaneval(PROBLEM)
    assert not t.calls and t.check is not None  # a program, not plain calls
    return t


def test_the_reference_passes_and_a_wrong_answer_fails(task, tmp_path):
    r = _grade(task, task.solution["solution.py"], tmp_path)
    assert r.value == 1.0 and r.components["check_verdict"] == 1.0 and r.components["check_calls"] == 31, r
    assert "in_process_verdict" not in r.components
    r = _grade(task, PROBLEM["prompt"] + "    return sum(abs(x) for x in v)\n", tmp_path)
    assert r.value == 0.0 and r.tests == {"test_solution.py::test_check": "failed"}, r


@pytest.mark.parametrize("name,body", [
    # the helper and `abs` redefined beside the solution: the check's own are used
    ("shadowed_helpers", "def _sq(x):\n    return 0\n\n\ndef abs(x):\n    return 0\n\n\ndef norm(v):\n    return 5.0\n"),
    # an object that equals anything, and a subclass of float claiming to be one
    ("always_equal", "class A:\n    def __eq__(self, o):\n        return True\n    def __sub__(self, o):\n"
                     "        return 0\n\n\ndef norm(v):\n    return A()\n"),
    ("float_subclass", "class F(float):\n    __module__ = 'builtins'\n    def __sub__(self, o):\n        return 0.0\n"
                       "    def __eq__(self, o):\n        return True\n\n\ndef norm(v):\n    return F(0)\n"),
    # a forged "done" message on every descriptor it has, then an exit
    ("forged_done", "import os\nfor fd in range(1, 20):\n    try:\n"
                    "        os.write(fd, b'{\"done\": true, \"passed\": true}\\n')\n"
                    "    except OSError:\n        pass\nos._exit(0)\n"),
    # looks for the test program on disk: it is not in the candidate's tree
    ("peek", "import os\n\n\ndef norm(v):\n    found = [n for d, _, ns in os.walk('/') for n in ns if n == 'check.json']\n"
             "    raise RuntimeError(str(found))\n"),
    ("never_answers", "def norm(v):\n    while True:\n        pass\n"),
])
def test_attacks_on_the_check_earn_nothing(task, tmp_path, name, body):
    cfg = EnvConfig(grade_cache=0, grade_timeout_s=3.0)
    r = _grade(task, body, tmp_path, cfg)
    assert r.value <= 0 and r.components["tests"] == 0.0 and r.components["check_verdict"] == 1.0, (name, r)


def test_shadowed_helpers_win_where_the_check_runs_beside_the_solution(task, tmp_path):
    """The same attack on the in-process path (the task without its check program): full reward. So the relay is
    what stops it, not an attack that fails on its own."""
    import dataclasses
    body = "def _sq(x):\n    return 0\n\n\ndef abs(x):\n    return 0\n\n\ndef norm(v):\n    return 5.0\n"
    old = dataclasses.replace(task, check=None)
    r = _grade(old, PROBLEM["prompt"].split("def norm")[0] + body, tmp_path)
    assert r.value == 1.0 and r.components.get("in_process_verdict") == 1.0, r


def test_a_reply_crosses_only_as_plain_values():
    assert answer(b'{"ok": true, "value": {"tuple": [1, "a"]}}', decode) == (1, "a")
    with pytest.raises(ValueError):
        answer(b'{"ok": true, "value": {"object": 1}}', decode)
    with pytest.raises(ValueError):
        answer(b'not json', decode)
    with pytest.raises(CandidateError, match="ValueError: x"):
        answer(b'{"ok": false, "error": "ValueError: x"}', decode)
    with pytest.raises(CandidateError, match="the call failed"):
        answer(b'[1]', decode)


def test_a_check_in_a_task_file_is_checked(tmp_path):
    base = {"id": "t", "problem": "p", "files": {"m.py": "def f(x):\n    return x\n"},
            "hidden_files": {"test_m.py": "from m import f\n\n\ndef test_check():\n    assert f(2) == 2\n"},
            "fail_to_pass": ["test_m.py::test_check"], "test_command": "python -c pass"}
    good = {"id": "test_m.py::test_check", "module": "m", "function": "f", "source": "def check(c):\n    assert c(2) == 2\n"}
    task = parse_flywheel({**base, "check": good})
    assert task.check == good
    for bad, says in [({**good, "source": "x = 1\n"}, "must define `check"),
                      ({**good, "function": "1f"}, "identifier"),
                      ({**good, "extra": 1}, "exactly the keys"),
                      ({**good, "id": "other"}, "grades by it alone")]:
        with pytest.raises(BrokenTask, match=says):
            parse_flywheel({**base, "check": bad})
    assert json.loads(json.dumps(task.check)) == good  # a task file round-trips it
