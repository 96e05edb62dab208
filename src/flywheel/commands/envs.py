"""Per-repository Python environments: build (or list) the environment of every task in a task file.

    flywheel envs build tasks.jsonl [--envs-dir DIR] [--retry] [--format swebench --repos-dir clones/]
    flywheel envs list [--envs-dir DIR]

`build` loads the tasks, takes each distinct `python_env` spec once (tasks/repoenv.py: a venv per spec, keyed by a
hash of it, shared by every task with that spec) and builds what is not built yet, printing each environment's
key, status (built, cached, failed), install seconds and disk size. A failed build is recorded and stays failed
(its tasks are broken in `flywheel tasks check`) until `--retry`. Exit code 1 when any environment failed.
"""

from __future__ import annotations

import argparse

HELP = "build the per-repository Python environments of a task file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build every task's environment (cached by content)")
    b.add_argument("path", help="JSONL task file")
    b.add_argument("--envs-dir", default=None, help="where environments live (default: env.python_envs_dir)")
    b.add_argument("--retry", action="store_true", help="rebuild environments whose last build failed")
    b.add_argument("--format", default="auto", choices=["auto", "flywheel", "swebench", "humaneval"])
    b.add_argument("--repos-dir", default=None, help="directory of local clones (SWE-bench tasks)")
    b.add_argument("--json", default=None, help="also write the builds as JSON here")
    ls = sub.add_parser("list", help="list the built and failed environments")
    ls.add_argument("--envs-dir", default=None, help="where environments live (default: env.python_envs_dir)")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from flywheel.config import EnvConfig
    from flywheel.tasks.repoenv import build_env, build_record, env_key, envs_root

    envs_dir = args.envs_dir or EnvConfig().python_envs_dir
    if args.action == "list":
        root = envs_root(envs_dir)
        for rec in sorted(root.glob("*/build.json")) if root.is_dir() else []:
            d = json.loads(rec.read_text())
            print(f"{d['key']}  built   {d['spec'].get('name', ''):24s} {d['install_s']:7.1f}s "
                  f"{d['disk_bytes'] / 2**20:7.1f} MiB  {len(d.get('packages', []))} packages")
        for rec in sorted(root.glob("*.failed.json")) if root.is_dir() else []:
            d = json.loads(rec.read_text())
            print(f"{d['key']}  FAILED  {d['spec'].get('name', ''):24s} {d['error'][-200:]}")
        return 0
    from flywheel.tasks.loaders import load_tasks

    try:
        load = load_tasks(args.path, fmt=args.format, repos_dir=args.repos_dir)
    except ValueError as err:
        print(f"flywheel envs build: {err}")
        return 2
    for broken in load.errors:
        print(f"broken: {broken}")
    specs: dict[str, dict] = {}
    users: dict[str, int] = {}
    for task in load.tasks:
        if task.python_env is not None:
            key = env_key(task.python_env)
            specs.setdefault(key, task.python_env)
            users[key] = users.get(key, 0) + 1
    builds = []
    for key, spec in specs.items():
        b = build_env(spec, envs_dir, retry=args.retry)
        builds.append(b)
        print(f"{b.key}  {b.status:7s} {b.name:24s} {b.install_s:7.1f}s {b.disk_bytes / 2**20:7.1f} MiB  "
              f"{users[key]} tasks" + (f"\n    {b.error[-600:]}" if b.error else ""))
    failed = sum(1 for b in builds if b.status == "failed")
    print(f"{len(builds)} environments ({sum(b.status == 'built' for b in builds)} built, "
          f"{sum(b.status == 'cached' for b in builds)} cached, {failed} failed) for {sum(users.values())} tasks; "
          f"{len(load.tasks) - sum(users.values())} tasks use the run's own Python")
    if args.json:
        Path(args.json).write_text(json.dumps([build_record(b) for b in builds], indent=1))
    return 1 if failed or load.errors else 0
