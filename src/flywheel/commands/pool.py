"""Grow or shrink the inference pool of a running Ray-backend run (docs/ray.md).

    flywheel pool add RUN_DIR [--region eu] [--num-engines 2]
    flywheel pool remove RUN_DIR 3 [--no-drain]        # node 3 (its id in `flywheel pool status RUN_DIR`)
    flywheel pool status RUN_DIR

Why a file: the running loop polls `RUN_DIR/pool/commands.jsonl` (one JSON command a line, appended here)
every time it waits for rollouts, and writes `RUN_DIR/pool/status.json` (engines, regions, versions,
counters). No port to open or secure, works on any shared file system, and the commands are a log.
"""

from __future__ import annotations

import argparse

HELP = "add or remove inference engines of a running Ray-backend run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = sub.add_parser("add", help="start engines that join at the newest weights")
    a.add_argument("run_dir", help="the run directory of a running `flywheel train` with backend = 'ray'")
    a.add_argument("--region", default=None, help="region label (default: the first of orchestrator.ray.regions)")
    a.add_argument("--num-engines", type=int, default=1, help="engines to add")
    r = sub.add_parser("remove", help="take an engine out (drains its in-flight groups first)")
    r.add_argument("run_dir")
    r.add_argument("node_id", type=int, help="engine id, as listed by `flywheel pool status`")
    r.add_argument("--no-drain", action="store_true", help="stop at once and hand its groups to other engines")
    s = sub.add_parser("status", help="print the pool status the run last wrote")
    s.add_argument("run_dir")


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from flywheel.orchestrator.ray import PoolControl

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise SystemExit(f"flywheel pool: '{run_dir}' is not a run directory")
    if args.action == "status":
        status = PoolControl(run_dir).status
        if not status.exists():
            raise SystemExit(f"flywheel pool: no {status} yet; is a run with orchestrator.backend = 'ray' running?")
        print(status.read_text())
        return 0
    if args.action == "add":
        if args.num_engines < 1:
            raise SystemExit("flywheel pool add: --num-engines must be >= 1")
        PoolControl.send(run_dir, "add", region=args.region, num_engines=args.num_engines)
    else:
        PoolControl.send(run_dir, "remove", node_id=args.node_id, drain=not args.no_drain)
    print(json.dumps({"queued": args.action, "commands": str(PoolControl(run_dir).commands)}))
    return 0
