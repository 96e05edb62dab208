"""API keys of `flywheel serve`, stored hashed in its event log.

    flywheel keys add alice --db runs/online/online.db [--rpm 60] [--max-body-kb 256]   # prints the key once
    flywheel keys list --db runs/online/online.db
    flywheel keys revoke key-0123abcd --db runs/online/online.db   # refused by every server within key_recheck_s
"""

from __future__ import annotations

import argparse

HELP = "create, list or revoke API keys of `flywheel serve` (stored hashed)"


def open_existing_log(db: str):
    """The event log at `db`, refused when it is a SQLite file that does not exist: a mistyped --db would
    otherwise create an empty log and answer from it. Only `flywheel serve` creates the log."""
    from pathlib import Path

    from flywheel.config import UserError
    from flywheel.online.events import EventLog

    if "://" not in db and not Path(db).expanduser().is_file():
        raise UserError(f"--db {db}: no event log there. Pass the file `flywheel serve` writes (online.serve.db_url; "
                        f"default <run_dir>/online.db, e.g. runs/online/online.db), or start `flywheel serve` "
                        f"first: it creates the log")
    if db.startswith("sqlite:///") and not Path(db.removeprefix("sqlite:///")).is_file():
        raise UserError(f"--db {db}: no SQLite file there; pass the log `flywheel serve` writes")
    return EventLog(db)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["add", "list", "revoke"])
    p.add_argument("name", nargs="?", default=None, help="add: the key's name (who uses it); revoke: its key id "
                   "(the first column of `list`)")
    p.add_argument("--db", required=True, help="the event log: a SQLAlchemy URL or a SQLite file path")
    p.add_argument("--rpm", type=int, default=600, help="requests per minute (default 600)")
    p.add_argument("--max-body-kb", type=int, default=1024, help="largest request body in KiB (default 1024)")


def run(args: argparse.Namespace) -> int:
    from flywheel.online.keys import new_key

    try:
        elog = open_existing_log(args.db)
        if args.action == "list":
            for k in elog.keys():
                flag = "\trevoked" if k.revoked else ""
                print(f"{k.key_id}\t{k.name}\t{k.requests_per_min} rpm\t{k.max_body_bytes} B{flag}")
            return 0
        if args.action == "revoke":
            if not args.name:
                raise ValueError("`flywheel keys revoke` needs a KEY_ID (the first column of `flywheel keys list`)")
            rec = elog.revoke_key(args.name)
            print(f"revoked {rec.key_id} ({rec.name})")
            return 0
        if not args.name:
            raise ValueError("`flywheel keys add` needs a NAME")
        key, rec = new_key(args.name, args.rpm, args.max_body_kb * 1024)
        elog.add_key(rec)
    except ValueError as err:
        raise SystemExit(f"flywheel keys: {err}") from None
    print(key)
    return 0
