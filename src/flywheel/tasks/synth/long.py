"""Long-horizon synthetic tasks: one easy bug in each of several padded modules, more work than one context window.

    flywheel tasks synth --long spread --num-files 6 --pad 3 --n 200 --out long.jsonl [--split heldout]
    tasks = generate_long_tasks(50, seed=0, split="train", num_files=6, pad_functions=3, kind="chain")

Why it looks like this: self-summarization (rollout/agent.py) only matters on a task whose session does not fit
`model.max_seq_len`. Each task is `num_files` stages; a stage is an `easy` synthetic task (generate.py: one
module, one injected bug whose fix is a short quoted edit) renamed to its own module, padded with
`pad_functions` correct functions from other templates, so that viewing it costs a few hundred tokens. Fixing
every stage (view, edit, and in `chain` mode a test run) takes roughly `num_files` x 300-500 tokens, several
windows of the demo's tiny model; a session solves the task only if every stage is fixed (all hidden tests pass).

* `spread`: the statement lists every stage's edit ("In `calc_1.py`, ... `+ 3` should be `+ 2`"), the way an
  easy statement does; what the session must carry across a summary is which stages are done.
* `chain`: the statement gives the first stage's edit only; stage i's visible test first checks that stage i - 1
  is fixed ("fix calc_0.py first") and its failure message then quotes stage i's edit. Each test run reveals the
  next fix, so a session must run the tests between fixes and the summary must carry what was learnt.

Splits as in generate.py: every stage and every padding function of a held-out task comes from the held-out
templates, which never appear in train. Grading is by the stages' calls (envs/calls.py), as for any synthetic
task; `task.solution` holds every fixed module, so `oracle_actions` replays the whole fix.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Literal

from flywheel.tasks.synth.generate import easy_statement, generate_tasks, with_runner
from flywheel.tasks.synth.mutations import instantiate
from flywheel.tasks.synth.templates import Split, templates_for
from flywheel.types import Task

Kind = Literal["spread", "chain"]
KINDS: tuple[str, ...] = ("spread", "chain")


@dataclasses.dataclass
class _Stage:
    module: str  # the stage's module name, e.g. "calc_1"
    task: Task  # the easy task, renamed to `module` and padded
    hint: str  # the easy statement of its fix


def _rename(task: Task, old: str, new: str) -> Task:
    """The easy task with its module `old` renamed `new`: files, test imports, test ids and calls."""
    def path(p: str) -> str:
        return {f"{old}.py": f"{new}.py", f"test_{old}.py": f"test_{new}.py",
                f"test_{old}_hidden.py": f"test_{new}_hidden.py"}.get(p, p)

    def src(s: str) -> str:
        return s.replace(f"from {old} import", f"from {new} import")

    def test_id(t: str) -> str:
        file, sep, name = t.partition("::")
        return path(file) + sep + name

    calls = [{**c, "id": test_id(c["id"]), "module": new if c["module"] == old else c["module"]} for c in task.calls]
    return dataclasses.replace(
        task, files={path(p): src(s) for p, s in task.files.items()},
        hidden_files={path(p): src(s) for p, s in task.hidden_files.items()},
        visible_tests=[path(p) for p in task.visible_tests], fail_to_pass=[test_id(t) for t in task.fail_to_pass],
        pass_to_pass=[test_id(t) for t in task.pass_to_pass], calls=calls,
        solution={path(p): s for p, s in (task.solution or {}).items()},
        meta={**task.meta, "module": f"{new}.py"})


def _pad(stage: Task, r: random.Random, split: Split, num: int) -> Task | None:
    """`num` correct functions of other templates appended to the stage's module (and to its fix)."""
    mod = stage.meta["module"]
    src, fixed = stage.files[mod], (stage.solution or {})[mod]
    names = {stage.meta["name"]}
    pool = [t for t in templates_for(split) if t.id != stage.meta["function"]]
    for t in r.sample(pool, k=min(num, len(pool))):
        name, body = instantiate(t, r)
        if name in names:
            continue
        names.add(name)
        src, fixed = src + "\n\n" + body, fixed + "\n\n" + body
    old = stage.meta["edit"][0]
    if src.count(old) != 1:  # the quoted edit must stay unique in the padded module
        return None
    return dataclasses.replace(stage, files={**stage.files, mod: src}, solution={mod: fixed})


def _first_assert(test_src: str) -> str:
    """The expression of the first `assert` of a generated test file (its first, failing, case)."""
    for line in test_src.splitlines():
        if line.strip().startswith("assert "):
            return line.strip()[len("assert "):]
    raise AssertionError("a generated test file has an assert")


def _chain_test(stage: _Stage, prev: _Stage) -> str:
    """Stage `stage`'s visible tests: each checks the previous stage first, and its failure quotes the fix."""
    vis = stage.task.visible_tests[0]
    name = prev.task.meta["name"]  # imported under an alias: the two stages' functions may share a name
    lines = [f"from {prev.module} import {name} as prev_{name}"]
    guard = _first_assert(prev.task.files[prev.task.visible_tests[0]])
    assert guard.startswith(name + "("), guard
    guard = f"prev_{guard}"
    for line in stage.task.files[vis].splitlines():
        if line.strip().startswith("assert "):  # a raising call is a failure with the same message
            expr = line.strip()[len("assert "):]
            lines.append(f"    assert _passes(lambda: {guard}), {'fix ' + prev.module + '.py first'!r}")
            lines.append(f"    assert _passes(lambda: {expr}), {stage.hint!r}")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n" + _PASSES


_PASSES = """

def _passes(check):
    try:
        return bool(check())
    except Exception:
        return False
"""


def _make_long(r: random.Random, seed: int, split: Split, kind: str, num_files: int, pad_functions: int,
               task_id: str) -> Task | None:
    easy = generate_tasks(num_files, seed=r.randrange(2**31), split=split, difficulty="easy", runner="pytest")
    stages: list[_Stage] = []
    for i, t in enumerate(easy):
        module = f"{t.meta['module'][:-3]}_{i}"
        padded = _pad(_rename(t, t.meta["module"][:-3], module), r, split, pad_functions)
        if padded is None:
            return None
        old, new = padded.meta["edit"]
        stages.append(_Stage(module, padded, easy_statement(f"{module}.py", padded.meta["name"], old, new)))
    files: dict[str, str] = {}
    hidden: dict[str, str] = {}
    for i, s in enumerate(stages):
        files.update(s.task.files)
        hidden.update(s.task.hidden_files)
        if kind == "chain" and i > 0:
            vis = s.task.visible_tests[0]
            files[vis] = hidden[vis] = _chain_test(s, stages[i - 1])
    n = len(stages)
    if kind == "spread":
        problem = (f"There are {n} bugs, one in each of {n} files. Fix all of them, then submit.\n"
                   + "\n".join(f"- {s.hint}" for s in stages))
    else:
        problem = (f"There are {n} bugs in a chain of {n} files. {stages[0].hint} Then run the tests: each "
                   "failing test tells you the next fix. Submit when every test passes.")
    return Task(
        id=task_id, problem=problem, files=files, hidden_files=hidden,
        visible_tests=[v for s in stages for v in s.task.visible_tests],
        fail_to_pass=[t for s in stages for t in s.task.fail_to_pass],
        pass_to_pass=[t for s in stages for t in s.task.pass_to_pass],
        calls=[c for s in stages for c in s.task.calls], test_command="python -m pytest -q",
        solution={p: v for s in stages for p, v in (s.task.solution or {}).items()},
        meta={"split": split, "difficulty": f"long{n}", "kind": kind, "num_files": n, "pad_functions": pad_functions,
              "mutation": "+".join(s.task.meta["mutation"] for s in stages),
              "function": "+".join(s.task.meta["function"] for s in stages),
              "modules": [f"{s.module}.py" for s in stages],
              "summary_facts": [f"{s.module}.py" for s in stages]})


def generate_long_tasks(n: int, seed: int = 0, split: Split = "train", num_files: int = 4, pad_functions: int = 3,
                        kind: str = "spread", runner: str = "minitest") -> list[Task]:
    """`n` long tasks; deterministic in every argument. See the module docstring."""
    if kind not in KINDS:
        raise ValueError(f"long task kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not 2 <= num_files <= 64:
        raise ValueError(f"num_files must be between 2 and 64 (one bug per file), got {num_files}")
    if not 0 <= pad_functions <= 16:
        raise ValueError(f"pad_functions must be between 0 and 16, got {pad_functions}")
    templates_for(split)  # validates split
    tasks: list[Task] = []
    attempt = 0
    while len(tasks) < n:
        if attempt > 20 * n + 50:
            raise RuntimeError(f"could only generate {len(tasks)} of {n} long tasks")
        r = random.Random(f"long:{seed}:{split}:{kind}:{num_files}:{pad_functions}:{attempt}")
        attempt += 1
        task = _make_long(r, seed, split, kind, num_files, pad_functions,
                          f"long-{kind}-{split}-{seed}-{num_files}x{pad_functions}-{len(tasks):05d}")
        if task is not None:
            tasks.append(with_runner(task, runner))
    return tasks
