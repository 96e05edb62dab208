"""Task files: generate synthetic bug-fix tasks, or check a task file.

    flywheel tasks synth --n 1000 --seed 0 --out tasks.jsonl [--split heldout] [--difficulty easy]
    flywheel tasks check tasks.jsonl [--format swebench --repos-dir clones/] [--grade]

`synth` writes verified tasks (the original passes every test, the mutant fails one) as flywheel JSONL;
`check` loads a file the way a run does and lists the broken tasks (exit code 1 when there are any); with
`--grade` it also grades, as a run would, each task's reference solution (must earn 1 with no flag) and its
untouched workspace (must earn less): a test command the grading guard cannot work with shows here.
"""

from __future__ import annotations

import argparse

HELP = "generate synthetic bug-fix tasks or check a task file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = sub.add_parser("synth", help="generate verified synthetic bug-fix tasks (JSONL)")
    s.add_argument("--n", type=int, default=1000, help="number of tasks")
    s.add_argument("--seed", type=int, default=0, help="generator seed")
    s.add_argument("--out", required=True, help="output JSONL path")
    s.add_argument("--split", choices=["train", "heldout"], default="train",
                   help="function templates to draw from (held-out templates never appear in train)")
    s.add_argument("--difficulty", choices=["easy", "medium", "hard"], default=None, help="default: a mix")
    s.add_argument("--runner", choices=["minitest", "pytest"], default="minitest",
                   help="test runner the tasks use (default: runtests.py, see tasks/minitest.py)")
    c = sub.add_parser("check", help="load a task file and report broken tasks")
    c.add_argument("path", help="JSONL task file")
    c.add_argument("--format", default="auto", choices=["auto", "flywheel", "swebench", "humaneval"])
    c.add_argument("--repos-dir", default=None, help="directory of local clones (SWE-bench tasks)")
    c.add_argument("--grade", action="store_true", help="grade each task's solution (must earn 1, no flag) and "
                   "its untouched workspace (must earn less)")


def run(args: argparse.Namespace) -> int:
    import json
    import time

    if args.action == "synth":
        from flywheel.tasks.synth import task_summary, write_tasks

        if args.n < 0:
            raise SystemExit("flywheel tasks synth: --n must be >= 0")
        t0 = time.perf_counter()
        tasks = write_tasks(args.out, args.n, seed=args.seed, split=args.split, difficulty=args.difficulty,
                            runner=args.runner)
        summary = task_summary(tasks)
        print(json.dumps({k: summary[k] for k in ("split", "difficulty", "mutation")}))
        print(f"wrote {len(tasks)} verified tasks ({len(summary['function'])} functions) to {args.out} "
              f"in {time.perf_counter() - t0:.1f}s")
        return 0
    from flywheel.tasks.loaders import load_tasks

    try:
        load = load_tasks(args.path, fmt=args.format, repos_dir=args.repos_dir)
    except ValueError as err:
        print(f"flywheel tasks check: {err}")
        return 2
    for problem in load.errors:
        print(f"broken: {problem}")
    print(f"{len(load.tasks)} tasks loaded, {len(load.errors)} broken")
    wrong = _grade_solutions(load.tasks) if args.grade else 0
    return 1 if load.errors or wrong else 0


def _grade_solutions(tasks) -> int:
    """Grade every task's solution and untouched workspace; prints each task that grades wrong."""
    import shutil
    import tempfile
    from pathlib import Path

    from flywheel.config import EnvConfig
    from flywheel.envs.reward import grade
    from flywheel.tasks.loaders import task_base_dir, write_files

    cfg, wrong, checked = EnvConfig(grade_cache=0), 0, 0
    root = Path(tempfile.mkdtemp(prefix="flywheel-check-"))
    try:
        for task in tasks:
            if not task.solution:
                print(f"no solution: {task.id} (not graded)")
                continue
            checked += 1
            rewards = {}
            for solved in (True, False):
                ws = root / "ws"
                shutil.rmtree(ws, ignore_errors=True)
                shutil.copytree(task_base_dir(task, root / "cache"), ws, symlinks=True)
                if solved:
                    write_files(ws, task.solution)
                rewards[solved] = grade(task, ws, cfg)
            good, bad = rewards[True], rewards[False]
            if good.value != 1.0 or good.flags or bad.value >= 1.0:
                wrong += 1
                print(f"grades wrong: {task.id}: solution {good.value} {good.flags} {good.notes[:2]}; "
                      f"untouched {bad.value}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{checked} solutions graded, {wrong} wrong")
    return wrong
