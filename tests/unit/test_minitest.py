"""runtests.py (tasks/minitest.py): same verdicts as pytest, pytest-shaped output and exit codes, tamper-proof."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.reward import grade, parse_junit
from flywheel.tasks import minitest
from flywheel.tasks.synth import RUNNER_FILE, generate_tasks, with_runner

RUNNER = Path(minitest.__file__)


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def _write(d: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return d


def _workspace(tmp_path: Path, task, fixed: bool, **changes: str) -> Path:
    ws = tmp_path / ("fixed" if fixed else "buggy")
    ws.mkdir()
    return _write(ws, {**task.files, **(task.solution if fixed else {}), **changes})


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(4, seed=3, difficulty="medium")


def test_grading_agrees_with_pytest(tmp_path, tasks):
    """The same workspaces graded through real sandboxes under both runners give identical per-test verdicts."""
    cfg = EnvConfig()
    for t in tasks:
        assert t.test_command == f"python {RUNNER_FILE} -q" and t.files[RUNNER_FILE] == t.hidden_files[RUNNER_FILE]
        plain = dataclasses.replace(t, files={p: s for p, s in t.files.items() if p != RUNNER_FILE},
                                    hidden_files={p: s for p, s in t.hidden_files.items() if p != RUNNER_FILE},
                                    test_command="python -m pytest -q")
        for fixed in (False, True):
            dirs = [tmp_path / f"{t.id}-{fixed}-{runner}" for runner in ("minitest", "pytest")]
            for d in dirs:
                d.mkdir()
            ours = grade(t, _workspace(dirs[0], t, fixed), cfg)
            theirs = grade(plain, _workspace(dirs[1], plain, fixed), cfg)
            assert ours.tests == theirs.tests and ours.value == theirs.value == (1.0 if fixed else 0.0), t.id
            assert not ours.flags


def test_an_edited_runner_is_restored_and_flagged(tmp_path, tasks):
    t = tasks[0]
    cheat = "import sys\nprint('all passed')\nsys.exit(0)\n"
    r = grade(t, _workspace(tmp_path, t, fixed=False, **{RUNNER_FILE: cheat}), EnvConfig())
    assert r.value < 0 and r.components["tests"] == 0.0 and "tests_edited" in r.flags


def test_output_exit_codes_and_junit(tmp_path):
    _write(tmp_path, {
        "calc.py": "def add(a, b):\n    return a - b\n",
        "test_calc.py": ("from calc import add\n\n\ndef test_ok():\n    assert add(2, 0) == 2\n\n\n"
                         "def test_bad():\n    print('debug line')\n    assert add(2, 3) == 5\n\n\n"
                         "def test_fixture(tmp_path):\n    pass\n\n\n"
                         "class TestMore:\n    def setup_method(self, m):\n        self.x = 4\n\n"
                         "    def test_in_class(self):\n        assert self.x == 4\n\n"
                         "    def test_raises(self):\n        raise KeyError('k')\n"),
    })
    r = _run(tmp_path, "-q", "-p", "no:cacheprovider", "--junitxml=report.xml", "test_calc.py")
    assert r.returncode == 1
    assert "assert -1 == 5" in r.stdout and "where -1 = add(2, 3)" in r.stdout and "debug line" in r.stdout
    assert "FAILED test_calc.py::test_bad - assert -1 == 5" in r.stdout
    assert "FAILED test_calc.py::TestMore::test_raises - KeyError: 'k'" in r.stdout
    assert "fixtures" in r.stdout and r.stdout.rstrip().splitlines()[-1] == "3 failed, 2 passed"
    report = parse_junit((tmp_path / "report.xml").read_text())
    assert report == {("test_calc", "test_ok"): "passed", ("test_calc", "test_bad"): "failed",
                      ("test_calc", "test_fixture"): "failed", ("test_calc.TestMore", "test_in_class"): "passed",
                      ("test_calc.TestMore", "test_raises"): "failed"}
    # node ids select; all passing exits 0
    r = _run(tmp_path, "test_calc.py::test_ok", "test_calc.py::TestMore::test_in_class")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("\n2 passed")


def test_report_holds_any_output_and_the_runner_imports_little(tmp_path):
    """A test that prints control characters and markup still gives a readable report (ElementTree wrote them
    raw, which no XML parser reads back); and the runner's start stays lean: the heavy stdlib modules it used to
    import on every run (half its time in a sandbox) load on no path but a syntax error's."""
    _write(tmp_path, {"test_noise.py": (
        "class Boom(Exception):\n    pass\n\n\n"
        "def test_noisy():\n    print('bell\\x07 <b>&amp;\"')\n    assert 1 + 1 == 3\n\n\n"
        "def test_custom():\n    raise Boom('x\\x01y')\n\n\ndef test_ok():\n    pass\n")})
    r = subprocess.run([sys.executable, "-X", "importtime", str(RUNNER), "--junitxml=r.xml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "assert 2 == 3" in r.stdout
    assert "FAILED test_noise.py::test_custom - test_noise.Boom: x\x01y" in r.stdout
    xml = (tmp_path / "r.xml").read_text()
    assert parse_junit(xml) == {("test_noise", "test_noisy"): "failed", ("test_noise", "test_custom"): "failed",
                                ("test_noise", "test_ok"): "passed"}
    assert "bell\ufffd <b>&amp;" in ET.fromstring(xml).find(".//failure").text
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "_ast" in imported and not imported & {"ast", "traceback", "linecache", "xml.etree.ElementTree",
                                                  "contextlib", "importlib.util"}, sorted(imported)


def test_collection_errors_and_hard_exits(tmp_path):
    _write(tmp_path, {"core.py": "def f(:\n", "test_core.py": "from core import f\n\n\ndef test_f():\n    assert f()\n",
                      "sub/test_other.py": "def test_x():\n    assert True\n"})
    r = _run(tmp_path, "--junitxml=r.xml")  # no targets: pytest's discovery, subdirectories included
    assert r.returncode == 2 and "ERROR collecting test_core.py" in r.stdout and "SyntaxError" in r.stdout
    assert parse_junit((tmp_path / "r.xml").read_text()) == {("sub.test_other", "test_x"): "passed"}
    (tmp_path / "core.py").write_text("import os\n\n\ndef f():\n    os._exit(0)\n")
    r = _run(tmp_path, "--junitxml=r2.xml", "test_core.py")
    assert not (tmp_path / "r2.xml").exists()  # no report: grading counts every test as missing, i.e. failed
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(empty).returncode == 5


def test_runner_choice_is_validated():
    t = generate_tasks(1, seed=0, runner="pytest")[0]
    assert RUNNER_FILE not in t.files and t.test_command == "python -m pytest -q"
    with pytest.raises(ValueError, match="minitest"):
        with_runner(t, "nose")
