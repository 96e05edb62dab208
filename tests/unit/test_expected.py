"""Computed expectations written as literals (envs/expected.py): which sides are probed, what the probe logs, which
side is chosen, and that the graded copy has a twin (envs/twins.py). The mining end to end (a real project's
environment, the reference and bugged trees, verification) is in tests/integration/test_repo_envs.py."""

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
    return [tuple(raw[s.start:s.end].decode() for s in pair) for pair in expected.computed_sides(source, classes, name)]


def test_sides_are_the_computed_equalities_before_the_test_can_leave():
    assert _side_texts(SOURCE, (), "test_words") == [("words(text)", '"a b c".split()')]
    assert _side_texts(SOURCE, (), "test_literal") == []  # a literal side: that test has a twin already
    assert _side_texts(SOURCE, (), "test_after_return") == []  # after a statement that can return
    assert _side_texts(SOURCE, ("TestCase",), "test_method") == [('words("Hi")', '[string.ascii_lowercase[7] + "i"]')]


def test_the_probe_logs_each_side_once_and_leaves_the_test_as_it_was(tmp_path):
    sides = [s for name, cls in (("test_words", ()), ("test_method", ("TestCase",)))
             for pair in expected.computed_sides(SOURCE, cls, name) for s in pair]
    probe = expected.instrument(SOURCE, sides)
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
    sides = [s for pair in expected.computed_sides(source, (), "test_obj") for s in pair]
    probe = expected.instrument(source, sides)
    script = tmp_path / "p.py"
    script.write_text("class Thing:\n    def __eq__(self, other):\n        return True\n\n\n"
                      "class L(list):\n    pass\n\n\ndef make():\n    return L([1])\n\n\n" + probe + "\ntest_obj()\n")
    log = tmp_path / "log.jsonl"
    subprocess.run([sys.executable, str(script)], check=True, env={**os.environ, expected.LOG_ENV: str(log)})
    assert sorted(expected.read_log(log).values()) == [[None], [None]]  # a list subclass is not a list


def _logs(pairs):
    return {k: [v] for k, v in pairs}


def test_the_side_chosen_is_the_one_the_bug_does_not_move():
    a, b = expected.Side(0, 5), expected.Side(9, 15)
    ref = [_logs([("0:5", "[1, 2]"), ("9:15", "[1, 2]")])] * 2
    assert expected.choose([(a, b)], ref, _logs([("0:5", "[1]"), ("9:15", "[1, 2]")])) == (b, "[1, 2]")
    assert expected.choose([(a, b)], ref, _logs([("0:5", "[1, 2]"), ("9:15", "[3]")])) == (a, "[1, 2]")
    # the bugged tree raised before the other side was evaluated: which side is expected is unknown
    assert expected.choose([(a, b)], ref, _logs([("9:15", "[1, 2]")])) is None
    # equal on the bugged tree: not the comparison the bug fails
    assert expected.choose([(a, b)], ref, _logs([("0:5", "[1, 2]"), ("9:15", "[1, 2]")])) is None
    # another value under another hash seed (a set's order, a time, an id): not a constant
    seeds = [ref[0], _logs([("0:5", "[2, 1]"), ("9:15", "[2, 1]")])]
    assert expected.choose([(a, b)], seeds, _logs([("0:5", "[1]"), ("9:15", "[1, 2]")])) is None
    # evaluated twice in a run (a loop, a helper called twice): not one value
    twice = [{"0:5": ["[1, 2]"], "9:15": ["[1, 2]", "[1, 2]"]}] * 2
    assert expected.choose([(a, b)], twice, _logs([("0:5", "[1]"), ("9:15", "[1, 2]")])) is None
    # the expected value is None: nothing a twin could change
    none = [_logs([("0:5", "None"), ("9:15", "None")])] * 2
    assert expected.choose([(a, b)], none, _logs([("0:5", "1"), ("9:15", "None")])) is None


def test_the_graded_copy_has_a_twin_that_changes_the_materialised_literal():
    (left, right), = expected.computed_sides(SOURCE, (), "test_words")
    graded = expected.materialise(SOURCE, {right: "['a', 'b', 'c']"})
    assert "assert words(text) == ['a', 'b', 'c']" in graded and "def test_literal" in graded
    assert [lit.text for lit in twins.literals(graded, (), "test_words")] == ["['a', 'b', 'c']"]
    twin = twins.twin_source(graded, (), "test_words", random.Random(0))
    assert twin is not None and twin != graded and len(twin) == len(graded)
    assert twins.literals(SOURCE, (), "test_words") == []  # the file as the project wrote it has none
