"""Synthetic bug-fix tasks: a seeded generator of tiny Python modules with tests and one injected bug.

    flywheel tasks synth --n 1000 --seed 0 --out tasks.jsonl [--split heldout] [--difficulty easy]
    tasks = generate_tasks(50, seed=0, split="train", difficulty="easy")

Why it looks like this:
* A task is one small module (`calc.py`: one function of 3-10 lines; two functions at `hard`), a visible
  test file and a hidden one. The module comes from one of ~40 *templates* with randomised function,
  variable and module names and constants; `ast.unparse` normalises the layout of the original and the
  mutant alike, so the diff between them is exactly the bug.
* Bugs are AST mutations: operator swap, off-by-one (comparison boundary, `range` bound, index),
  wrong constant, swapped arguments/operands, missing branch (an `if` deleted or its guard dropped).
* Difficulty is how much the statement gives away. `easy`: the file and the exact old and new line (a
  tiny model can solve it by copying from the statement into `str_replace`); `medium`: the file, the
  function and a failing call; `hard`: only a failing call, and the module holds a second function.
* Splits are by template: held-out templates (every fourth) never appear in train, so held-out pass@1
  measures generalisation to functions the policy has never seen, not memorisation.
* Verification is in-process: the module and its test files are exec'd in a private module namespace and
  the `test_*` functions called directly (~1 ms per task), instead of one pytest subprocess per task
  (~0.5 s each, minutes for 1000). A task is kept only if the original passes every test and the mutant
  fails at least one. Templates have no `while` loops or recursion, so no mutant can hang the generator.
* Tests run under `runtests.py` (`tasks/minitest.py`, shipped with each task and restored at grading),
  a pytest-compatible runner that starts in ~20 ms instead of pytest's ~450 ms; every session is graded
  and the agent runs the tests too, so this is most of a rollout's CPU. `runner="pytest"` (config
  `synth.test_runner`) keeps plain pytest; both grade identically (tests/unit/test_minitest.py).

`oracle_actions(task)` replays the known fix through the tools (view, str_replace, submit); it is used by
tests and to write mid-training transcripts.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import random
import re
from pathlib import Path
from typing import Any

from flywheel.tasks import datatests
from flywheel.tasks.loaders import RUNNER_FILE, runner_source, save_tasks
from flywheel.tasks.synth.mutations import instantiate, mutate, mutation_sites
from flywheel.tasks.synth.templates import (
    DIFFICULTIES,
    MODULE_NAMES,
    NUM_HIDDEN_CASES,
    NUM_VISIBLE_CASES,
    Split,
    Template,
    templates_for,
)
from flywheel.tasks.synth.verify import call_in_module, run_tests_inprocess
from flywheel.types import Task


def _call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _test_file(module: str, names: list[str], cases: list[tuple[str, str, tuple, Any]]) -> str:
    """cases: (test name, function, args, expected)."""
    lines = [f"from {module} import {', '.join(sorted(set(names)))}", ""]
    for test, fn, args, expected in cases:
        lines += ["", f"def {test}():", f"    assert {_call_text(fn, args)} == {expected!r}", ""]
    return "\n".join(lines)


def _line_diff(old: str, new: str) -> tuple[list[str], list[str]]:
    """The changed lines (old side, new side) between two sources, as one block."""
    a, b = old.splitlines(), new.splitlines()
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not ops:
        return [], []
    i1, j1 = ops[0][1], ops[0][3]
    i2, j2 = ops[-1][2], ops[-1][4]
    return a[i1:i2], b[j1:j2]


_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")


def minimal_edit(old_line: str, new_line: str, current: str, target: str) -> tuple[str, str] | None:
    """The shortest (old, new) pair of whole-token spans of one changed line such that replacing the single
    occurrence of `old` in `current` by `new` gives `target`. Easy statements quote it, the oracle applies
    it: copying `+ 34` → `+ 32` is what a small model can learn, a whole line is much harder."""
    a, b = _TOKEN.findall(old_line), _TOKEN.findall(new_line)
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    q = 0
    while q < min(len(a), len(b)) - p and a[-1 - q] == b[-1 - q]:
        q += 1
    lo, hi_a, hi_b = p, len(a) - q, len(b) - q
    while True:
        old, new = "".join(a[lo:hi_a]), "".join(b[lo:hi_b])
        if old.strip() and new.strip():
            for o, n in ((old.strip(), new.strip()), (old, new)):
                if current.count(o) == 1 and current.replace(o, n, 1) == target:
                    return o, n
        if lo > 0:
            lo -= 1
        elif hi_a < len(a) and hi_b < len(b):
            hi_a, hi_b = hi_a + 1, hi_b + 1
        else:
            return None


def _cases(t: Template, r: random.Random, name: str, src: str, num: int) -> list[tuple[tuple, Any]]:
    seen: set[str] = set()
    out: list[tuple[tuple, Any]] = []
    for _ in range(num * 8):
        args = t.args(r)
        key = repr(args)
        if key in seen:
            continue
        seen.add(key)
        ok, value = call_in_module(src, name, args)
        if ok:
            out.append((args, value))
        if len(out) == num:
            break
    return out


def _make_task(r: random.Random, split: Split, difficulty: str, task_id: str) -> Task | None:
    pool = templates_for(split)
    t = r.choice(pool)
    name, src = instantiate(t, r)
    module = r.choice(MODULE_NAMES)
    cases = _cases(t, r, name, src, NUM_VISIBLE_CASES + NUM_HIDDEN_CASES)
    if len(cases) < NUM_VISIBLE_CASES + 2:
        return None
    tree = ast.parse(src)
    sites = mutation_sites(tree)
    kinds = sorted({k for k, _ in sites})
    r.shuffle(kinds)
    for kind in kinds:
        for _, ordinal in r.sample([s for s in sites if s[0] == kind], k=sum(1 for s in sites if s[0] == kind)):
            mutant = ast.unparse(mutate(tree, kind, ordinal, r)) + "\n"
            if mutant == src:
                continue
            old_lines, new_lines = _line_diff(mutant, src)
            if difficulty == "easy" and (len(old_lines) != 1 or len(new_lines) != 1
                                         or mutant.count(old_lines[0].strip()) != 1):
                continue
            outcomes = [(args, want, call_in_module(mutant, name, args)) for args, want in cases]
            failing = [i for i, (_, want, got) in enumerate(outcomes) if not (got[0] and got[1] == want)]
            if not failing:
                continue  # equivalent on these inputs: try another site
            return _assemble(r, t, split, difficulty, task_id, module, name, src, mutant, kind, cases, failing,
                             outcomes[failing[0]], old_lines, new_lines)
    return None


def easy_statement(mod_file: str, name: str, old: str, new: str) -> str:
    """The `easy` problem statement: it names the file and quotes the exact edit."""
    return f"In `{mod_file}`, function `{name}` returns the wrong value: `{old}` should be `{new}`."


def _assemble(r, t, split, difficulty, task_id, module, name, src, mutant, kind, cases, failing, first_fail,
              old_lines, new_lines) -> Task | None:
    # Visible cases: the first failing one and a passing one, so `run_tests` shows the bug.
    passing = [i for i in range(len(cases)) if i not in failing]
    visible_idx = [failing[0]] + passing[:1] if passing else failing[:2]
    hidden_idx = [i for i in range(len(cases)) if i not in visible_idx]
    names = [name]
    module_src, orig_src = mutant, src
    if difficulty == "hard":  # a second, correct function from another template of the same split
        others = [o for o in templates_for(split) if o.id != t.id]
        o = r.choice(others)
        o_name, o_src = instantiate(o, r)
        if o_name == name:
            return None
        o_cases = _cases(o, r, o_name, o_src, 2)
        if len(o_cases) < 2:
            return None
        before = r.random() < 0.5
        module_src = (o_src + "\n\n" + mutant) if before else (mutant + "\n\n" + o_src)
        orig_src = (o_src + "\n\n" + src) if before else (src + "\n\n" + o_src)
        names.append(o_name)
    vis = [(f"test_{k}", name, cases[i][0], cases[i][1]) for k, i in enumerate(visible_idx)]
    hid = [(f"test_h{k}", name, cases[i][0], cases[i][1]) for k, i in enumerate(hidden_idx)]
    if difficulty == "hard":
        hid += [(f"test_h{len(hid) + k}", names[1], a, v) for k, (a, v) in enumerate(o_cases)]
    vis_file, hid_file = f"test_{module}.py", f"test_{module}_hidden.py"
    vis_src, hid_src = _test_file(module, names, vis), _test_file(module, names, hid)
    # Verify the files themselves: the original passes every test, the mutant fails at least one.
    f2p: list[str] = []
    p2p: list[str] = []
    for path, tsrc in ((vis_file, vis_src), (hid_file, hid_src)):
        good = run_tests_inprocess(module, orig_src, tsrc)
        bad = run_tests_inprocess(module, module_src, tsrc)
        if not good or not all(good.values()):
            return None
        for test in good:
            (p2p if bad.get(test, False) else f2p).append(f"{path}::{test}")
    if not f2p:
        return None
    args, want, (ok, got) = first_fail
    call = _call_text(name, args)
    got_text = f"{got!r}" if ok else f"raises {got}"
    mod_file = f"{module}.py"
    edit = None
    if difficulty == "easy":
        edit = minimal_edit(old_lines[0], new_lines[0], module_src, orig_src)
        if edit is None:
            return None
        problem = easy_statement(mod_file, name, edit[0], edit[1])
    elif difficulty == "medium":
        problem = f"In `{mod_file}`, function `{name}` is wrong: `{call}` should return {want!r} but {got_text}."
    else:
        problem = f"`{call}` should return {want!r} but {got_text}. Fix the bug."
    # The same cases as data: grading calls the function and compares the values itself (envs/calls.py); the
    # test files stay for the agent's own runs and for `integrity=False` (the bench's undefended baseline).
    calls = [datatests.call(f"{path}::{test}", module, fn, a, v)
             for path, cases_of in ((vis_file, vis), (hid_file, hid)) for test, fn, a, v in cases_of]
    return Task(
        id=task_id, problem=problem, files={mod_file: module_src, vis_file: vis_src}, visible_tests=[vis_file],
        hidden_files={vis_file: vis_src, hid_file: hid_src}, fail_to_pass=f2p, pass_to_pass=p2p, calls=calls,
        test_command="python -m pytest -q", solution={mod_file: orig_src},
        meta={"split": split, "difficulty": difficulty, "mutation": kind, "function": t.id, "name": name,
              "module": mod_file, "old": old_lines, "new": new_lines, **({"edit": list(edit)} if edit else {})})


RUNNERS = ("minitest", "pytest")


def _check_runner(runner: str) -> None:
    if runner not in RUNNERS:
        raise ValueError(f"test runner must be one of {RUNNERS}, got {runner!r}")


def with_runner(task: Task, runner: str) -> Task:
    """The task graded by `runner`: "pytest" as generated, or "minitest" — `runtests.py` shipped in the
    workspace and among the hidden files (so grading writes it back over any edit)."""
    _check_runner(runner)
    if runner == "pytest":
        return task

    src = runner_source()
    return dataclasses.replace(task, files={**task.files, RUNNER_FILE: src},
                               hidden_files={**task.hidden_files, RUNNER_FILE: src},
                               test_command=f"python {RUNNER_FILE} -q")


def generate_tasks(n: int, seed: int = 0, split: Split = "train", difficulty: str | None = None,
                   runner: str = "minitest") -> list[Task]:
    """`n` verified tasks; deterministic in (n, seed, split, difficulty). `difficulty=None` mixes all three."""
    _check_runner(runner)
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES} or None, got {difficulty!r}")
    templates_for(split)  # validates split
    tasks: list[Task] = []
    attempt = 0
    while len(tasks) < n:
        if attempt > 50 * n + 100:
            raise RuntimeError(f"could only generate {len(tasks)} of {n} verified tasks")
        r = random.Random(f"{seed}:{split}:{difficulty}:{attempt}")
        attempt += 1
        level = difficulty or r.choice(DIFFICULTIES)
        # The id names everything the task depends on, so files generated with other settings can be merged.
        task = _make_task(r, split, level, f"synth-{split}-{seed}-{difficulty or 'mix'}-{len(tasks):05d}")
        if task is not None:
            tasks.append(with_runner(task, runner))
    return tasks


def write_tasks(path: str | Path, n: int, seed: int = 0, split: Split = "train",
                difficulty: str | None = None, runner: str = "minitest") -> list[Task]:
    """Generate and save as flywheel JSONL (readable by `flywheel.tasks.loaders.load_tasks`)."""
    tasks = generate_tasks(n, seed=seed, split=split, difficulty=difficulty, runner=runner)
    save_tasks(tasks, path)
    return tasks
