"""Computed expectations written as literals (envs/expected.py): which sides are probed, what the probe logs, which
side is chosen, and that the graded copy has a twin (envs/twins.py). The mining end to end (a real project's
environment, the reference and bugged trees, verification) is in tests/integration/test_mined_twins.py."""

import os
import random
import subprocess
import sys

from flywheel.envs import expected, twins

SOURCE = '''"""Tests that compute what they expect."""
from __future__ import annotations

import string


def test_words():
    text = "A b  C"
    assert words(text) == "a b c".split()


def test_literal():
    assert words("x") == ["x"]


def test_after_return():
    if words(""):
        return
    assert words("q") == list("q")


class TestCase:
    def test_method(self):
        self.assertEqual(words("Hi"), [string.ascii_lowercase[7] + "i"])
'''


def _side_texts(source, classes, name):
    raw = source.encode()
    return [(raw[e.left.start:e.left.end].decode(), raw[e.right.start:e.right.end].decode())
            for e in expected.equalities(source, classes, name)]


def test_sides_are_the_computed_equalities_before_the_test_can_leave():
    assert _side_texts(SOURCE, (), "test_words") == [("words(text)", '"a b c".split()')]
    assert _side_texts(SOURCE, (), "test_literal") == []  # a literal side: that test has a twin already
    assert _side_texts(SOURCE, (), "test_after_return") == []  # after a statement that can return
    assert _side_texts(SOURCE, ("TestCase",), "test_method") == [('words("Hi")', '[string.ascii_lowercase[7] + "i"]')]
    assert _side_texts(SOURCE, (), "test_words[1]") == []  # a parametrized row: one place, several values


def test_the_probe_logs_each_side_once_and_leaves_the_test_as_it_was(tmp_path):
    eqs = [e for name, cls in (("test_words", ()), ("test_method", ("TestCase",)))
           for e in expected.equalities(SOURCE, cls, name)]
    sides = [s for e in eqs for s in (e.left, e.right)]
    probe = expected.probe_values(SOURCE, eqs)
    assert probe is not None and probe.startswith('"""Tests that compute what they expect."""\nfrom __future__ import')
    script = tmp_path / "probe.py"
    script.write_text("def words(t):\n    return t.lower().split()\n\n\nclass _Case:\n"
                      "    def assertEqual(self, a, b):\n        assert a == b\n\n\n"
                      + probe.split("\n", 2)[2]  # the docstring and the __future__ import must come first: drop them
                      + "\ntest_words()\nTestCase.assertEqual = _Case.assertEqual\nTestCase().test_method()\n")
    log = tmp_path / "log.jsonl"
    subprocess.run([sys.executable, str(script)], check=True, env={**os.environ, expected.LOG_ENV: str(log)})
    got = expected.read_log(log)
    assert sorted(v for texts in got.values() for v in texts) == sorted(["['a', 'b', 'c']"] * 2 + ["['hi']"] * 2)
    assert all(len(texts) == 1 for texts in got.values()) and set(got) == {s.key for s in sides}


def test_a_value_repr_cannot_write_exactly_is_logged_as_none(tmp_path):
    source = "def test_obj():\n    assert make() == Thing()\n"
    probe = expected.probe_values(source, expected.equalities(source, (), "test_obj"))
    script = tmp_path / "p.py"
    script.write_text("class Thing:\n    def __eq__(self, other):\n        return True\n\n\n"
                      "class L(list):\n    pass\n\n\ndef make():\n    return L([1])\n\n\n" + probe + "\ntest_obj()\n")
    log = tmp_path / "log.jsonl"
    subprocess.run([sys.executable, str(script)], check=True, env={**os.environ, expected.LOG_ENV: str(log)})
    assert sorted(expected.read_log(log).values()) == [[None], [None]]  # a list subclass is not a list


def test_the_bugged_trees_probe_evaluates_every_side_and_asserts_nothing(tmp_path):
    """On the bugged tree an equality whose first side raises must still show its second side's value, and the
    equalities after a failing one must run too: each statement becomes a call that evaluates the sides alone."""
    source = ("def test_two():\n    assert broken() == [1] + [2]\n    assert len('ab') == sum([1, 1])\n"
              "    assert [0] == [3 - 3]\n")
    eqs = expected.equalities(source, (), "test_two")
    assert len(eqs) == 2  # the last equality has a literal side: it has a twin already
    probe = expected.probe_sides(source, eqs)
    script = tmp_path / "p.py"
    script.write_text("def broken():\n    raise NotImplementedError\n\n\n" + probe + "\ntest_two()\n")
    log = tmp_path / "log.jsonl"
    subprocess.run([sys.executable, str(script)], check=True, env={**os.environ, expected.LOG_ENV: str(log)})
    got = expected.read_log(log)
    assert [got[s.key] for e in eqs for s in (e.left, e.right)] == [[None], ["[1, 2]"], ["2"], ["2"]]


def _logs(pairs):
    return {k: [v] for k, v in pairs}


def test_the_side_chosen_is_the_one_the_bug_does_not_move():
    a, b = expected.Side(0, 5), expected.Side(9, 15)
    eq = expected.Equality(expected.Side(0, 15), a, b)
    ref = [_logs([("0:5", "[1, 2]"), ("9:15", "[1, 2]")])] * 2
    assert expected.choose([eq], ref, _logs([("0:5", "[1]"), ("9:15", "[1, 2]")])) == (b, "[1, 2]")
    assert expected.choose([eq], ref, _logs([("0:5", "[1, 2]"), ("9:15", "[3]")])) == (a, "[1, 2]")
    # the actual side raised on the bugged tree (logged as None): the other is the expected one
    assert expected.choose([eq], ref, _logs([("0:5", None), ("9:15", "[1, 2]")])) == (b, "[1, 2]")
    # a side not evaluated at all on the bugged tree (an earlier statement raised): nothing is known
    assert expected.choose([eq], ref, _logs([("9:15", "[1, 2]")])) is None
    # equal on the bugged tree: not the comparison the bug fails
    assert expected.choose([eq], ref, _logs([("0:5", "[1, 2]"), ("9:15", "[1, 2]")])) is None
    # another value under another hash seed (a set's order, a time, an id): not a constant
    seeds = [ref[0], _logs([("0:5", "[2, 1]"), ("9:15", "[2, 1]")])]
    assert expected.choose([eq], seeds, _logs([("0:5", "[1]"), ("9:15", "[1, 2]")])) is None
    # evaluated twice in a run (a loop, a helper called twice): not one value
    twice = [{"0:5": ["[1, 2]"], "9:15": ["[1, 2]", "[1, 2]"]}] * 2
    assert expected.choose([eq], twice, _logs([("0:5", "[1]"), ("9:15", "[1, 2]")])) is None
    # the expected value is None: nothing a twin could change
    none = [_logs([("0:5", "None"), ("9:15", "None")])] * 2
    assert expected.choose([eq], none, _logs([("0:5", "1"), ("9:15", "None")])) is None


def test_the_graded_copy_has_a_twin_that_changes_the_materialised_literal():
    eq, = expected.equalities(SOURCE, (), "test_words")
    graded = expected.materialise(SOURCE, {eq.right: "['a', 'b', 'c']"})
    assert "assert words(text) == ['a', 'b', 'c']" in graded and "def test_literal" in graded
    assert [lit.text for lit in twins.literals(graded, (), "test_words")] == ["['a', 'b', 'c']"]
    twin = twins.twin_source(graded, (), "test_words", random.Random(0))
    assert twin is not None and twin != graded and len(twin) == len(graded)
    assert twins.literals(SOURCE, (), "test_words") == []  # the file as the project wrote it has none
