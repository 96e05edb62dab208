"""Bugs injected into real functions (tasks/mine/bugs.py): one spot changes, the rest of the file is untouched."""

import ast
import difflib
import random

from flywheel.tasks.mine.bugs import KINDS, candidate_bugs, is_source_module

SRC = '''"""A module with comments and odd formatting, which a splice must keep."""
import math


def clamp(x,  lo, hi):   # spacing kept
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    return min(x, hi)


class Stats:
    def mean(self, xs):
        total = 0
        for x in xs:
            total += x
        return total / len(xs) if xs else 0.0

    def spread(self, xs):
        return max(xs) - min(xs) + 2 * (len(xs) % 3)


def tiny(): return 1
'''


def test_every_bug_changes_one_spot_and_keeps_the_rest():
    bugs = candidate_bugs("pkg/mod.py", SRC, random.Random(0), per_function=10)
    kinds = {b.kind for seed in range(6) for b in candidate_bugs("pkg/mod.py", SRC, random.Random(seed), per_function=10)}
    assert kinds == {"operator", "constant", "swap_args", "off_by_one", "blank_body"} == set(KINDS)
    for bug in bugs:
        assert bug.old_text == SRC and bug.new_text != SRC
        ast.parse(bug.new_text)
        changed = [line for line in difflib.unified_diff(SRC.splitlines(), bug.new_text.splitlines(), n=0, lineterm="")
                   if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
        if bug.kind == "blank_body":
            assert changed[-1].replace(" ", "") == "+raiseNotImplementedError"
            assert '"""Clamp x into [lo, hi]."""' in bug.new_text  # the docstring says what to write back
        else:
            assert len(changed) == 2, changed  # one line out, one line in
            assert "# spacing kept" in bug.new_text
    # functions of fewer than MIN_BODY_LINES lines after the `def` are left alone
    assert {b.function for b in bugs} == {"Stats.mean", "clamp"}


def test_a_splice_that_would_change_precedence_is_parenthesised():
    src = "def f(a, b, c):\n    y = a * b + c\n    return y\n"
    for bug in candidate_bugs("m.py", src, random.Random(1), per_function=50):
        if bug.kind == "operator" and "a * b" not in bug.new_text:
            # `a * b` mutated to `a + b` inside `... + c`: written so that it still parses to the mutant
            assert "(a + b) + c" in bug.new_text or "a + b + c" in bug.new_text


def test_source_modules_exclude_tests_docs_and_packaging():
    assert is_source_module("pkg/core.py") and is_source_module("src/pkg/core.py")
    for path in ("tests/test_core.py", "pkg/tests/helpers.py", "setup.py", "conftest.py", "docs/conf.py",
                 "pkg/core_test.py", "README.md"):
        assert not is_source_module(path), path
