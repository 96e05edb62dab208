"""The printed-log parsers (tasks/testlogs.py): pytest's summary, unittest -v and Django's runner, adversarial logs."""

import pytest

from flywheel.tasks.testlogs import detect, parse_django, parse_log, parse_pytest, parse_unittest

PYTEST_LOG = """\
============================= test session starts ==============================
collected 5 items

tests/test_a.py ..F.s                                                    [100%]
=================================== FAILURES ===================================
___________________________________ test_c ____________________________________
    def test_c():
>       assert f(1) == 2
E       assert 3 == 2
tests/test_a.py:9: AssertionError
PASSED tests/test_a.py::test_a
=========================== short test summary info ============================
PASSED tests/test_a.py::test_a
PASSED tests/test_a.py::TestK::test_b[1-2]
FAILED tests/test_a.py::test_c - assert 3 == 2
SKIPPED [1] tests/test_a.py:20: no network
XFAIL tests/test_a.py::test_x - known bug
ERROR tests/test_a.py::test_e - fixture 'db' not found
==================== 1 failed, 2 passed, 1 skipped in 0.05s ====================
"""


def test_pytest_summary_lines_give_ids_and_statuses():
    got = parse_pytest(PYTEST_LOG)
    assert got == {"tests/test_a.py::test_a": "passed", "tests/test_a.py::TestK::test_b[1-2]": "passed",
                   "tests/test_a.py::test_c": "failed", "tests/test_a.py::test_x": "skipped",
                   "tests/test_a.py::test_e": "error"}


def test_a_second_line_cannot_turn_a_failure_into_a_pass():
    log = "FAILED t.py::test_a - boom\nPASSED t.py::test_a\n"
    assert parse_pytest(log) == {"t.py::test_a": "failed"}
    assert parse_pytest("PASSED t.py::test_a\nFAILED t.py::test_a\n") == {"t.py::test_a": "failed"}


def test_pytest_ignores_lines_that_only_look_like_results():
    log = "  PASSED t.py::test_a\nPASSED not-a-node-id\nprint: PASSED t.py::test_b\nPASSEDt.py::test_c\n"
    assert parse_pytest(log) == {}


UNITTEST_LOG = """\
test_add (pkg.tests.test_core.CoreTests.test_add) ... ok
test_div (pkg.tests.test_core.CoreTests) ... FAIL
test_old (pkg.tests.test_core.CoreTests.test_old) ... skipped 'py2 only'
test_doc (pkg.tests.test_core.CoreTests.test_doc)
Checks the docstring form. ... ok
test_noisy (pkg.tests.test_core.CoreTests.test_noisy) ... some output printed by the test
ERROR
test_xf (pkg.tests.test_core.CoreTests.test_xf) ... expected failure
test_us (pkg.tests.test_core.CoreTests.test_us) ... unexpected success

======================================================================
FAIL: test_div (pkg.tests.test_core.CoreTests)
----------------------------------------------------------------------
Traceback (most recent call last):
AssertionError: 1 != 2

Ran 7 tests in 0.003s
FAILED (failures=1, errors=1, skipped=1)
"""


def test_unittest_verbose_lines_old_and_new_id_forms():
    got = parse_unittest(UNITTEST_LOG)
    p = "pkg.tests.test_core.CoreTests."
    assert got == {p + "test_add": "passed", p + "test_div": "failed", p + "test_old": "skipped",
                   p + "test_doc": "passed", p + "test_noisy": "error", p + "test_xf": "skipped",
                   p + "test_us": "failed"}


def test_django_runner_log():
    log = ("test_migrate (migrations.test_commands.MigrateTests.test_migrate) ... ok\n"
           "test_squash (migrations.test_commands.SquashTests) ... skipped 'Database has no feature'\n"
           "test_fail (migrations.test_commands.MigrateTests) ... ERROR\n")
    assert parse_django(log) == {"migrations.test_commands.MigrateTests.test_migrate": "passed",
                                 "migrations.test_commands.SquashTests.test_squash": "skipped",
                                 "migrations.test_commands.MigrateTests.test_fail": "error"}


def test_auto_detects_the_format_and_refuses_unknown_kinds():
    assert detect(PYTEST_LOG) == "pytest" and detect(UNITTEST_LOG) == "unittest"
    assert parse_log(UNITTEST_LOG)["pkg.tests.test_core.CoreTests.test_add"] == "passed"
    with pytest.raises(ValueError, match="log parser must be"):
        parse_log("", "nose")
