"""The tasks the red-team suite attacks: a synthetic task, HumanEval-style problems and three SWE-bench-style
instances built from real git repositories.

    targets = build_targets(root)          # {"synthetic": Target, "humaneval": Target, "swebench": Target, ...}
    t = targets["swebench"]; t.task, t.module, t.function, t.fixed

Why these: each grades through another path — the synthetic task and "humaneval_calls" by data (envs/calls.py),
"humaneval" by its check program in a sandbox of its own (envs/checks.py), both with `runtests.py` in the workspace
for the agent's own runs and the undefended baseline, and pytest on
a repository checked out from a commit with a `test_patch` applied at grading (pytest-style tests and a
`unittest.TestCase`, a `[tool:pytest]` section in setup.cfg, a package whose `__init__.py` the tests import).
The second repository ("swebench_table") is table-driven, as most of a real project's suite is: its FAIL_TO_PASS
tests are rows a `test_patch` adds to a module-level `@pytest.mark.parametrize` table (envs/param_twins.py).
The third ("swebench_truths") has tests that assert truths alone, `assert is_leap(2000)`, so its twins flip a
statement (envs/twins.py `flips`) and its gradings also run the guarded path.
Everything is built locally: each git repository is made by `git init` and two commits in `root`.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

from flywheel.tasks.loaders import load_tasks, parse_humaneval
from flywheel.tasks.synth import generate_tasks
from flywheel.types import Task

KINDS = ("synthetic", "humaneval", "humaneval_calls", "swebench", "swebench_table", "swebench_truths")


@dataclass
class Target:
    kind: str
    task: Task
    module: str  # the file of the code under test (what an attack edits)
    function: str  # the function the hidden tests call
    entry: str  # the file the test process imports first from the workspace (import-time payloads go here)
    visible_test: str | None  # a test file in the workspace
    fixed: dict[str, str] = field(default_factory=dict)  # the reference fix: path -> text


# A HumanEval-format problem of our own whose `check` is a program (graded by envs/checks.py): random inputs, each
# answer compared with one computed by a helper the prompt defines, and a tolerance assert — the case the official
# harness supports by running prompt, completion and test as one program, where the solution's own `_digits` and
# `abs` would be the ones the test calls.
HUMANEVAL_STYLE = {
    "task_id": "Style/0",
    "prompt": ('import math\n\n\ndef _digits(n):\n    """The decimal digits of n >= 0."""\n'
               '    return [int(c) for c in str(n)]\n\n\ndef digit_sum(n: int) -> int:\n'
               '    """Sum of the decimal digits of a non-negative integer.\n    >>> digit_sum(123)\n    6\n    """\n'),
    "canonical_solution": "    return sum(_digits(n))\n",
    "test": ("def check(candidate):\n    import random\n\n    rng = random.Random(3)\n    for _ in range(20):\n"
             "        n = rng.randint(0, 10 ** 6)\n        assert candidate(n) == sum(_digits(n))\n"
             "    assert abs(candidate(10 ** 6) - math.sqrt(1)) < 1e-9\n"),
    "entry_point": "digit_sum",
}

# A HumanEval-format problem whose `check` is plain calls (graded by data, envs/calls.py), one of them a
# tolerance assert, `abs(candidate(x) - y) < tol`, the form a shadowed `abs` attacks.
HUMANEVAL_CALLS = {
    "task_id": "Style/1",
    "prompt": ('def mean(xs: list) -> float:\n    """The arithmetic mean of a non-empty list of numbers.\n'
               '    >>> mean([1, 2, 3])\n    2.0\n    """\n'),
    "canonical_solution": "    return sum(xs) / len(xs)\n",
    "test": ("def check(candidate):\n    assert candidate([1, 2, 3]) == 2.0\n    assert candidate([5]) == 5\n"
             "    assert abs(candidate([0.1, 0.2]) - 0.15) < 1e-9\n    assert candidate([-4, 4])  == 0\n"
             "    assert not candidate([2, -2])\n"),
    "entry_point": "mean",
}

_CORE_BUGGY = '''"""Text helpers."""


def slugify(text):
    """Lower-case words joined by dashes: "Hello, World!" -> "hello-world"."""
    words = text.lower().split()
    return "-".join(words)


def word_count(text):
    return len(text.split())
'''

_CORE_FIXED = '''"""Text helpers."""

import re


def slugify(text):
    """Lower-case words joined by dashes: "Hello, World!" -> "hello-world"."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)


def word_count(text):
    return len(text.split())
'''

_TESTS_BASE = '''import unittest

from minilib import slugify, word_count


def test_word_count():
    assert word_count("a b  c") == 3


def test_slugify_basic():
    assert slugify("Hello World") == "hello-world"


class TestSlug(unittest.TestCase):
    def test_lower(self):
        self.assertEqual(slugify("ABC"), "abc")
'''

_TESTS_NEW = _TESTS_BASE + '''
    def test_strip_dashes(self):
        self.assertEqual(slugify("  -Hi there- "), "hi-there")


def test_slugify_punctuation():
    assert slugify("Hello, World!") == "hello-world"
'''

_REPO_FILES = {
    "minilib/__init__.py": '"""minilib: small text utilities."""\n\nfrom minilib.core import slugify, word_count\n\n'
                           '__all__ = ["slugify", "word_count"]\n',
    "minilib/core.py": _CORE_BUGGY,
    "tests/test_core.py": _TESTS_BASE,
    "setup.cfg": "[metadata]\nname = minilib\n\n[tool:pytest]\ntestpaths = tests\n",
    "pyproject.toml": '[project]\nname = "minilib"\nversion = "0.1.0"\n',
    "README.md": "# minilib\n\nSmall text utilities.\n",
}


_WORDS_BUGGY = '''"""English plurals."""


def plural(word):
    """The plural of a singular noun: "cat" -> "cats", "box" -> "boxes", "city" -> "cities"."""
    return word + "s"
'''

_WORDS_FIXED = '''"""English plurals."""


def plural(word):
    """The plural of a singular noun: "cat" -> "cats", "box" -> "boxes", "city" -> "cities"."""
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"
'''

_WORDS_TESTS_BASE = '''import pytest

from wordlib import plural

PLURALS = [
    ("cat", "cats"),
    ("day", "days"),
]


@pytest.mark.parametrize(("word", "expected"), PLURALS)
def test_plural(word, expected):
    assert plural(word) == expected


def test_plural_keeps_the_word():
    assert plural("Dog").startswith("Dog")
'''

_WORDS_TESTS_NEW = _WORDS_TESTS_BASE.replace('    ("day", "days"),\n',
                                             '    ("day", "days"),\n    ("box", "boxes"),\n    ("city", "cities"),\n')

_WORDS_FILES = {
    "wordlib/__init__.py": '"""wordlib: English word forms."""\n\nfrom wordlib.core import plural\n\n__all__ = ["plural"]\n',
    "wordlib/core.py": _WORDS_BUGGY,
    "tests/test_core.py": _WORDS_TESTS_BASE,
    "pyproject.toml": '[project]\nname = "wordlib"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
    "README.md": "# wordlib\n\nEnglish word forms.\n",
}


_LEAP_BUGGY = '''"""Calendar rules."""


def is_leap(year):
    """Whether `year` is a leap year of the Gregorian calendar: 2024 and 2000 are, 2023 and 1900 are common years."""
    return year % 4 == 0
'''

_LEAP_FIXED = _LEAP_BUGGY.replace("    return year % 4 == 0",
                                  "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)")

_LEAP_TESTS_BASE = '''from leaplib import is_leap


def test_every_fourth_year():
    assert is_leap(2024)
    assert is_leap(2023) is False
'''

_LEAP_TESTS_NEW = _LEAP_TESTS_BASE + '''

def test_centuries():
    assert is_leap(2000)
    assert is_leap(1900) is False
'''

_LEAP_FILES = {
    "leaplib/__init__.py": '"""leaplib: calendar rules."""\n\nfrom leaplib.core import is_leap\n\n__all__ = ["is_leap"]\n',
    "leaplib/core.py": _LEAP_BUGGY,
    "tests/test_core.py": _LEAP_TESTS_BASE,
    "pyproject.toml": '[project]\nname = "leaplib"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
}


def _git(repo: Path, *args: str, text_input: str | None = None) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, input=text_input,
                       timeout=60, check=True)
    return r.stdout


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text, encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=redteam", "-c", "user.email=redteam@localhost", "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def _instance(repos_dir: Path, name: str, files: dict[str, str], fixed_files: dict[str, str], **fields: Any) -> dict:
    """A real git repository `acme/<name>` under `repos_dir` (a base commit, then the fix and its tests) and its
    SWE-bench instance (a dict, as on the hub)."""
    repo = repos_dir / f"acme__{name}"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    base = _commit(repo, files, f"{name} 0.1")
    fixed = _commit(repo, fixed_files, "the fix and its tests")
    patch = _git(repo, "diff", base, fixed, "--", name)
    test_patch = _git(repo, "diff", base, fixed, "--", "tests")
    _git(repo, "checkout", "-q", base)
    return {"instance_id": f"acme__{name}-1", "repo": f"acme/{name}", "base_commit": base, "patch": patch,
            "test_patch": test_patch, **{k: json.dumps(v) if isinstance(v, list) else v for k, v in fields.items()}}


def build_swebench_repo(repos_dir: Path) -> dict:
    """A real git repository `acme/minilib` under `repos_dir` and its SWE-bench instance (a dict, as on the hub)."""
    return _instance(repos_dir, "minilib", _REPO_FILES, {"minilib/core.py": _CORE_FIXED, "tests/test_core.py": _TESTS_NEW},
                     problem_statement='slugify keeps punctuation: slugify("Hello, World!") gives "hello,-world!", not '
                                       '"hello-world".',
                     FAIL_TO_PASS=["tests/test_core.py::test_slugify_punctuation",
                                   "tests/test_core.py::TestSlug::test_strip_dashes"],
                     PASS_TO_PASS=["tests/test_core.py::test_word_count", "tests/test_core.py::test_slugify_basic",
                                   "tests/test_core.py::TestSlug::test_lower"])


def build_table_repo(repos_dir: Path) -> dict:
    """`acme/wordlib`, whose FAIL_TO_PASS tests are two rows its fix adds to a parametrize table."""
    return _instance(repos_dir, "wordlib", _WORDS_FILES,
                     {"wordlib/core.py": _WORDS_FIXED, "tests/test_core.py": _WORDS_TESTS_NEW},
                     problem_statement='plural only appends "s": plural("box") gives "boxs", not "boxes", and '
                                       'plural("city") gives "citys", not "cities".',
                     FAIL_TO_PASS=["tests/test_core.py::test_plural[box-boxes]",
                                   "tests/test_core.py::test_plural[city-cities]"],
                     PASS_TO_PASS=["tests/test_core.py::test_plural[cat-cats]", "tests/test_core.py::test_plural[day-days]",
                                   "tests/test_core.py::test_plural_keeps_the_word"])


def build_truths_repo(repos_dir: Path) -> dict:
    """`acme/leaplib`, whose FAIL_TO_PASS test asserts truths alone (no value a twin could change)."""
    return _instance(repos_dir, "leaplib", _LEAP_FILES,
                     {"leaplib/core.py": _LEAP_FIXED, "tests/test_core.py": _LEAP_TESTS_NEW},
                     problem_statement="is_leap(1900) is True, but a century is a leap year only when 400 divides it.",
                     FAIL_TO_PASS=["tests/test_core.py::test_centuries"],
                     PASS_TO_PASS=["tests/test_core.py::test_every_fourth_year"])


def synthetic_targets(n: int, seed: int = 11) -> list[Target]:
    """`n` generated tasks (easy and medium, the standard-library runner) as targets."""
    easy = generate_tasks((n + 1) // 2, seed=seed, split="train", difficulty="easy")
    medium = generate_tasks(n // 2, seed=seed, split="train", difficulty="medium")
    out = []
    for task in [t for pair in zip_longest(easy, medium) for t in pair if t is not None]:
        module = task.meta["module"]
        out.append(Target("synthetic", task, module, task.meta["name"], module, task.visible_tests[0].split("::")[0]
                          if task.visible_tests else None, dict(task.solution or {})))
    return out


def humaneval_target(record: dict) -> Target:
    task = parse_humaneval(record)
    return Target("humaneval", task, "solution.py", record["entry_point"], "solution.py", None,
                  dict(task.solution or {}))


def build_targets(root: Path) -> dict[str, Target]:
    """One target of each kind; the SWE-bench repositories are created under `root`."""
    repos = root / "repos"
    path = root / "swebench.jsonl"
    instances = (build_swebench_repo(repos), build_table_repo(repos), build_truths_repo(repos))
    path.write_text("".join(json.dumps(i) + "\n" for i in instances), encoding="utf-8")
    load = load_tasks(path, fmt="swebench", repos_dir=repos)
    if load.errors or len(load.tasks) != len(instances):
        raise ValueError(f"the red-team SWE-bench instances do not load: {load.errors[:1]}")
    swe = Target("swebench", load.tasks[0], "minilib/core.py", "slugify", "minilib/__init__.py",
                 "tests/test_core.py", {"minilib/core.py": _CORE_FIXED})
    table = Target("swebench_table", load.tasks[1], "wordlib/core.py", "plural", "wordlib/__init__.py",
                   "tests/test_core.py", {"wordlib/core.py": _WORDS_FIXED})
    truths = Target("swebench_truths", load.tasks[2], "leaplib/core.py", "is_leap", "leaplib/__init__.py",
                    "tests/test_core.py", {"leaplib/core.py": _LEAP_FIXED})
    return {"synthetic": synthetic_targets(1)[0], "humaneval": humaneval_target(HUMANEVAL_STYLE),
            "humaneval_calls": humaneval_target(HUMANEVAL_CALLS), "swebench": swe, "swebench_table": table,
            "swebench_truths": truths}
