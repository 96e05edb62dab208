"""Per-test statuses from a test run's printed log: pytest (`-rA`), unittest (`-v`) and Django's runner.

    parse_log(output, "pytest")     # {"tests/test_x.py::test_y": "passed", ...}
    parse_log(output, "unittest")   # {"tests.test_x.TestA.test_y": "failed", ...}
    parse_log(output, "django")     # same ids as unittest (Django prints `test_y (app.tests.TestA.test_y) ... ok`)
    parse_log(output)               # "auto": whichever format the log is in

Why our own: the field's usual parsers are the `swebench` package's (`swebench.harness.log_parsers`), but that
package pulls in docker, datasets, modal and more for four small functions; these follow the same rules (the
short test summary of pytest, the `name (id) ... status` lines of unittest and Django, the multi-line form where a
test's docstring or output sits between its name and its status) and are tested on adversarial logs
(tests/unit/test_testlogs.py). Statuses are flywheel's: passed, failed, error, skipped. A test that appears twice
keeps its worst status, so a log cannot turn a failure into a pass by printing a second line.
"""

from __future__ import annotations

import re

STATUSES = ("passed", "failed", "error", "skipped")
_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
_PYTEST_RX = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+?)(?:\s+-\s.*)?$")
_PYTEST_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
                  "XFAIL": "skipped", "XPASS": "failed"}
# `test_y (pkg.mod.TestA.test_y) ... ok` (3.11+) or `test_y (pkg.mod.TestA) ... ok` (older, and Django's)
_UNITTEST_RX = re.compile(r"^(\w+) \(([\w.]+)\)(?: \S.*?)?\s\.\.\.\s?(.*)$")
_UNITTEST_HEAD_RX = re.compile(r"^(\w+) \(([\w.]+)\)")
_UNITTEST_STATUS = {"ok": "passed", "FAIL": "failed", "ERROR": "error", "skipped": "skipped",
                    "expected failure": "skipped", "unexpected success": "failed"}


def _keep(out: dict[str, str], tid: str, status: str) -> None:
    if tid not in out or _RANK[status] > _RANK[out[tid]]:
        out[tid] = status


def parse_pytest(log: str) -> dict[str, str]:
    """pytest's short test summary (run with `-rA`, or `-rfEsxXp`): `PASSED path::test` lines."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        m = _PYTEST_RX.match(line.rstrip())
        if m and "::" in m.group(2):
            _keep(out, m.group(2), _PYTEST_STATUS[m.group(1)])
    return out


def _unittest_id(name: str, where: str) -> str:
    return where if where.endswith("." + name) else f"{where}.{name}"


def _unittest_status(text: str) -> str | None:
    text = text.strip()
    for word, status in _UNITTEST_STATUS.items():
        if text == word or text.startswith(word + " ") or (word == "skipped" and text.startswith("skipped")):
            return status
    return None


def parse_unittest(log: str) -> dict[str, str]:
    """`python -m unittest -v` (and Django's `runtests.py -v 2`): `test_y (mod.TestA.test_y) ... ok` lines.

    A test whose docstring or printed output comes between its name and its status spans several lines; the
    status is then taken from the first later line that is only a status word."""
    out: dict[str, str] = {}
    pending: str | None = None
    for raw in log.splitlines():
        line = raw.rstrip()
        m = _UNITTEST_RX.match(line)
        if m:
            tid = _unittest_id(m.group(1), m.group(2))
            status = _unittest_status(m.group(3))
            if status is None:
                pending = tid  # the status comes on a later line
            else:
                _keep(out, tid, status)
                pending = None
            continue
        head = _UNITTEST_HEAD_RX.match(line)
        if head and not line.startswith(("FAIL:", "ERROR:")):
            pending = _unittest_id(head.group(1), head.group(2))
            continue
        if pending is not None:
            tail = line.split("...")[-1] if "..." in line else line
            status = _unittest_status(tail)
            if status is not None:
                _keep(out, pending, status)
                pending = None
    return out


def parse_django(log: str) -> dict[str, str]:
    """Django's test runner at verbosity 2: the unittest format, plus its `... skipped 'why'` lines."""
    return parse_unittest(log)


def detect(log: str) -> str:
    """"pytest" when the log has pytest's summary lines, else "unittest"."""
    return "pytest" if any(_PYTEST_RX.match(line.rstrip()) for line in log.splitlines()) else "unittest"


PARSERS = {"pytest": parse_pytest, "unittest": parse_unittest, "django": parse_django}


def parse_log(log: str, kind: str = "auto") -> dict[str, str]:
    """Test id -> status from a printed log; ValueError for a kind that is not "auto" or one of PARSERS."""
    if kind == "auto":
        kind = detect(log)
    if kind not in PARSERS:
        raise ValueError(f"log parser must be 'auto' or one of {sorted(PARSERS)}, got {kind!r}")
    return PARSERS[kind](log)
