"""Deploys of `flywheel serve`: roll back, or show the history (every deploy and rollback with its reason).

    flywheel deploy rollback --db runs/online/online.db --reason "accept rate fell after v7"
    flywheel deploy status --db runs/online/online.db

A rollback is an event in the log; every serving process installs the version it names within
online.serve.deploy_poll_s, through the weight store (online/deploy.py).
"""

from __future__ import annotations

import argparse

HELP = "roll back the deployed policy version, or show deploys and rollbacks with their reasons"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["rollback", "status"])
    p.add_argument("--db", required=True, help="the event log: a SQLAlchemy URL or a SQLite file path")
    p.add_argument("--reason", default="", help="rollback: why (recorded with the event; required)")


def run(args: argparse.Namespace) -> int:
    import datetime

    from flywheel.commands.keys import open_existing_log
    from flywheel.online.deploy import deployed_version, rollback

    try:
        elog = open_existing_log(args.db)
        if args.action == "rollback":
            ev = rollback(elog, "manual: " + args.reason if args.reason.strip() else "")
            print(f"rollback to version {ev.version} (event {ev.seq}): {ev.reason}")
            return 0
    except ValueError as err:
        raise SystemExit(f"flywheel deploy: {err}") from None
    events = elog.events(("deploy", "rollback", "gate_reject"))
    for ev in events:
        when = datetime.datetime.fromtimestamp(ev.created_s, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{when}  {ev.kind:<11} v{ev.version}  {ev.reason}")
    version = deployed_version(events)
    print(f"deployed: version {version}" if version is not None else "deployed: none yet (`flywheel serve` deploys "
          "version 0 at its first start)")
    return 0
