"""Task files: generate synthetic bug-fix tasks, mine real-code ones, or check a task file.

    flywheel tasks synth --n 1000 --seed 0 --out tasks.jsonl [--split heldout] [--difficulty easy]
    flywheel tasks synth --long chain --num-files 6 --pad 3 --n 200 --out long.jsonl [--split heldout]
    flywheel tasks mine --projects inflection==0.5.1,toolz==0.12.1 --out mined.jsonl [--verify [--require-twins]]
        [--config FILE] [--mine.candidate_timeout_max_s 120 --mine.test_memory_mb 4096 ...]
    flywheel tasks check tasks.jsonl [--format swebench --repos-dir clones/] [--grade] [--envs-dir DIR]

`synth` writes verified tasks (the original passes every test, the mutant fails one) as flywheel JSONL;
`mine` injects bugs into real projects (source distributions from the package index, pinned NAME==VERSION, or
`--dir NAME=PATH`) and keeps those their own test suites catch (tasks/mine/), then writes the computed expectations
of their untwinned tests as literals from the reference tree (envs/expected.py, `mine.materialise_expected`) so that
those tests get twins; `--verify` then grades each kept task as a run would and drops any whose fix does not
earn 1 or whose bugged tree does not earn 0 (with `--require-twins`, also any with a FAIL_TO_PASS test that has
no twin or only a flipped truth), and prints which verdict graded the kept tasks (data, suite, suite with some
tests left to the guard, in-process; envs/verify.py `verdict_kind`). Every command mining
runs has the wall-clock and memory limits of the `[mine]` config section (a config file and `--mine.KEY VALUE`
overrides); a candidate whose tests time out is rejected with that reason (the report's `rejected`, `timeouts`).
`check` loads a file the way a run does and lists the broken tasks (exit code 1 when there are any), tasks whose
own environment (`python_env`) is not built or failed to build among them; with
`--grade` it also grades, as a run would, each task's reference solution (must earn 1 with no flag) and its
untouched workspace (must earn less): a test command the grading guard cannot work with shows here.
"""

from __future__ import annotations

import argparse

HELP = "generate synthetic bug-fix tasks or check a task file"
ACCEPTS_OVERRIDES = True  # `tasks mine` only: `--mine.KEY VALUE` (the limits of mining, config/mine.py)


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
    s.add_argument("--long", choices=["spread", "chain"], default=None, help="long-horizon tasks, one easy bug in "
                   "each of --num-files padded modules, more than one context window (tasks/synth/long.py): "
                   "'spread' lists every fix, 'chain' reveals each next fix in a test's output")
    s.add_argument("--num-files", type=int, default=4, help="--long: files, one bug each (the chain's length)")
    s.add_argument("--pad", type=int, default=3, help="--long: correct functions added to each file")
    m = sub.add_parser("mine", help="mine real-code bug-fix tasks from real projects (SWE-smith style)")
    m.add_argument("--projects", default="", help="comma-separated pinned source distributions, NAME==VERSION")
    m.add_argument("--dir", action="append", default=[], metavar="NAME=PATH",
                   help="a project already on disk (with its tests), repeatable")
    m.add_argument("--out", required=True, help="output JSONL path (flywheel format)")
    m.add_argument("--cache-dir", default="runs/mine", help="downloads, unpacked sources and the task repositories "
                   "(the tasks refer to them: keep it)")
    m.add_argument("--envs-dir", default=None, help="per-repository environments (default: env.python_envs_dir)")
    m.add_argument("--max-per-project", type=int, default=50, help="tasks kept per project at most")
    m.add_argument("--max-tries", type=int, default=None, help="candidate bugs tried per project (default 4x max)")
    m.add_argument("--seed", type=int, default=0, help="which bugs are tried, in which order")
    m.add_argument("--verify", action="store_true", help="grade every kept task (fix -> 1, bugged -> 0) and keep "
                   "only those that pass")
    m.add_argument("--require-twins", action="store_true", help="with --verify: keep only tasks every FAIL_TO_PASS "
                   "test of which has a twin with a changed value, so the suite verdict grades them with no test "
                   "left to the guard (docs/integrity.md)")
    m.add_argument("--report", default=None, help="also write the per-project report (JSON) here")
    m.add_argument("config", nargs="?", default=None, help="config file whose [mine] section sets the timeouts and "
                   "memory limits (default: the defaults of docs/config.md); `--mine.KEY VALUE` overrides one")
    m.add_argument("--config", dest="config_opt", default=None, help=argparse.SUPPRESS)  # the older spelling
    c = sub.add_parser("check", help="load a task file and report broken tasks")
    c.add_argument("path", help="JSONL task file")
    c.add_argument("--format", default="auto", choices=["auto", "flywheel", "swebench", "humaneval"])
    c.add_argument("--repos-dir", default=None, help="directory of local clones (SWE-bench tasks)")
    c.add_argument("--envs-dir", default=None, help="per-repository environments (default: env.python_envs_dir)")
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
        if args.long:
            from flywheel.tasks.loaders import save_tasks
            from flywheel.tasks.synth.long import generate_long_tasks

            try:
                tasks = generate_long_tasks(args.n, seed=args.seed, split=args.split, num_files=args.num_files,
                                            pad_functions=args.pad, kind=args.long, runner=args.runner)
            except ValueError as err:
                raise SystemExit(f"flywheel tasks synth: {err}") from None
            save_tasks(tasks, args.out)
        else:
            tasks = write_tasks(args.out, args.n, seed=args.seed, split=args.split, difficulty=args.difficulty,
                                runner=args.runner)
        summary = task_summary(tasks)
        print(json.dumps({k: summary[k] for k in ("split", "difficulty", "mutation")}))
        print(f"wrote {len(tasks)} verified tasks ({len(summary['function'])} functions) to {args.out} "
              f"in {time.perf_counter() - t0:.1f}s")
        return 0
    if args.action == "mine":
        return _mine(args)
    if args.overrides:
        raise SystemExit(f"flywheel tasks {args.action}: unrecognized arguments: {' '.join(args.overrides)}")
    from flywheel.config import EnvConfig
    from flywheel.tasks.loaders import load_tasks
    from flywheel.tasks.repoenv import env_problem

    try:
        load = load_tasks(args.path, fmt=args.format, repos_dir=args.repos_dir)
    except ValueError as err:
        print(f"flywheel tasks check: {err}")
        return 2
    cfg = EnvConfig(grade_cache=0, **({"python_envs_dir": args.envs_dir} if args.envs_dir else {}))
    for broken in load.errors:
        print(f"broken: {broken}")
    ready, num_env_errors = [], 0
    for task in load.tasks:
        problem = env_problem(task.python_env, cfg.python_envs_dir)
        if problem is None:
            ready.append(task)
        else:
            num_env_errors += 1
            print(f"broken: task {task.id!r}: {problem}")
    print(f"{len(load.tasks)} tasks loaded, {len(load.errors) + num_env_errors} broken")
    wrong = _grade_solutions(ready, cfg) if args.grade else 0
    return 1 if load.errors or num_env_errors or wrong else 0


def _grade_solutions(tasks, cfg) -> int:
    """Grade every task's solution and untouched workspace; prints each task that grades wrong."""
    from flywheel.envs.verify import verdict_summary, verify_tasks

    results = verify_tasks(tasks, cfg)
    for r in results:
        if r.error == "no solution":
            print(f"no solution: {r.task_id} (not graded)")
        elif not r.ok:
            print(f"grades wrong: {r.task_id}: solution {r.solved} {r.flags} {r.error[:300]}; untouched {r.untouched}")
    checked = [r for r in results if r.error != "no solution"]
    wrong = sum(1 for r in checked if not r.ok)
    print(f"{len(checked)} solutions graded, {wrong} wrong; {verdict_summary(checked)}")
    return wrong


def _mine(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    from pathlib import Path

    from flywheel.config import EnvConfig, load_config
    from flywheel.tasks.loaders import save_tasks
    from flywheel.tasks.mine import mine_directory, mine_project

    if args.require_twins and not args.verify:
        print("flywheel tasks mine: --require-twins keeps tasks by how their fix grades; add --verify")
        return 2
    limits = load_config(args.config or args.config_opt, args.overrides).mine
    cfg = EnvConfig(grade_cache=0, **({"python_envs_dir": args.envs_dir} if args.envs_dir else {}))
    pins = [p.strip() for p in args.projects.split(",") if p.strip()]
    dirs = []
    for item in args.dir:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_dir():
            raise SystemExit(f"flywheel tasks mine: --dir takes NAME=PATH with an existing directory, got {item!r}")
        dirs.append((name, Path(path)))
    if not pins and not dirs:
        raise SystemExit("flywheel tasks mine: give --projects NAME==VERSION,... or --dir NAME=PATH")
    kw = {"max_tasks": args.max_per_project, "max_tries": args.max_tries, "seed": args.seed, "limits": limits}
    tasks, reports = [], []
    sources = [(pin, None) for pin in pins] + [(name, path) for name, path in dirs]
    interrupted = False
    for name, path in sources:  # Ctrl-C keeps what was mined: the task file is written below all the same
        try:
            if path is None:
                got, rep = mine_project(name, args.cache_dir, cfg.python_envs_dir, **kw)
            else:
                got, rep = mine_directory(name, path, args.cache_dir, cfg.python_envs_dir, **kw)
        except KeyboardInterrupt:  # between candidates (a download, the environment build, the baseline run)
            interrupted = True
            break
        tasks += got
        reports.append(rep)
        print(_line(rep))
        if rep.interrupted:
            interrupted = True
            break
    if interrupted:
        print(f"interrupted: writing the {len(tasks)} tasks mined so far"
              + (" (verified first; interrupt again to keep only those verified by then)" if args.verify else ""))
    if limits.materialise_expected and tasks and not interrupted:  # computed expectations as literals: twins
        from flywheel.envs.expected import materialise_tasks

        tasks, line = materialise_tasks(tasks, cfg.python_envs_dir, limits)
        print(line)
    dropped = 0
    if args.verify:
        import tempfile

        from flywheel.envs.verify import verdict_summary, verify_task

        kept, results = [], []
        with tempfile.TemporaryDirectory(prefix="flywheel-verify-") as scratch:
            try:  # one task at a time, so that an interrupt keeps those verified by then
                for t in tasks:
                    results.append(verify_task(t, cfg, Path(scratch)))
                    if results[-1].ok and (results[-1].verdict == "suite" or not args.require_twins):
                        kept.append(t)
                    else:
                        dropped += 1
            except KeyboardInterrupt:
                interrupted = True
                print(f"interrupted: {len(kept)} tasks verified, the rest not written")
        print(verdict_summary([r for r in results if r.ok]))
        tasks = kept
    save_tasks(tasks, args.out)
    if args.report:
        Path(args.report).write_text(json.dumps([dataclasses.asdict(r) for r in reports], indent=1, default=str))
    print(f"wrote {len(tasks)} tasks to {args.out}" + (f" ({dropped} dropped by verification)" if args.verify else ""))
    if interrupted:
        return 130
    return 0 if tasks else 1


def _line(rep) -> str:
    """One project's outcome: kept / tried, the rejection reasons, and the error that stopped it, if any."""
    why = ", ".join(f"{k} {v}" for k, v in sorted(rep.rejected.items()))
    return (f"{rep.project}: kept {rep.kept} of {rep.tried} tried" + (f"; rejected: {why}" if why else "")
            + (f" ({rep.error[:300]})" if rep.error else "") + (" (interrupted)" if rep.interrupted else ""))
