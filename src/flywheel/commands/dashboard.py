"""Serve the live dashboard over a directory of runs (or one run): charts, tiles, the rollout browser.

    flywheel dashboard runs/                       # http://127.0.0.1:8765/
    flywheel dashboard runs/demo --port 9000
    flywheel dashboard runs/ --host 0.0.0.0 --token "$(openssl rand -hex 16)"
    flywheel dashboard runs/online --online-window 64   # an online run (`flywheel serve`): deploys, accept rate
    flywheel dashboard runs/ --online-db online=postgresql+psycopg://user@host/db   # a log on PostgreSQL

Read-only; loopback unless told otherwise, and then only with a token (metrics/dashboard/server.py). An online
run's event log is found here and read with online/events.py's EventLogReader, which this layer hands to the
dashboard (metrics/ sits below online/ and reads through its own EventSource protocol): `--online-db` first, then
`online.serve.db_url` of the run's config.json, then `<run_dir>/online.db` once it exists.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flywheel.online.events import EventLogReader

HELP = "serve the live web dashboard of a runs directory (read-only)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs_dir", nargs="?", default="runs", help="a directory of run directories, or one run (default: runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; others need --token)")
    p.add_argument("--port", type=int, default=8765, help="TCP port (default 8765)")
    p.add_argument("--token", default=None, help="secret every request must carry (?token=… once, then a cookie)")
    p.add_argument("--poll-s", type=float, default=1.0, help="seconds between reads of what the runs appended")
    p.add_argument("--online-window", type=int, default=32,
                   help="an online run's live accept rate: over this many newest accept/reject events (default 32)")
    p.add_argument("--online-db", action="append", default=[], metavar="[RUN=]URL",
                   help="the event log of an online run kept elsewhere than <run_dir>/online.db (online.serve.db_url, "
                        "e.g. on PostgreSQL): RUN=URL for the run directory RUN under runs_dir, or URL alone when "
                        "runs_dir is that run; repeat for several runs")


def parse_online_dbs(values: list[str], root: Path) -> dict[str, str]:
    """Run name -> event log URL from `--online-db [RUN=]URL` (RUN has no ':' or '/', so a URL's '=' is safe)."""
    out = {}
    for v in values:
        name, sep, url = v.partition("=")
        if not sep or ":" in name or "/" in name:
            name, url = root.resolve().name, v
        if not name or not url:
            raise SystemExit(f"flywheel dashboard: --online-db {v!r}: give RUN=URL, or URL when runs_dir is that run")
        out[name] = url
    return out


def event_log_opener(urls: dict[str, str]) -> Callable[[Path, dict[str, Any]], EventLogReader | None]:
    """The dashboard's EventSourceOpener: a run's event log by --online-db, its config, or <run_dir>/online.db."""
    from flywheel.metrics.dashboard.online import DB_NAME
    from flywheel.online.events import EventLogReader

    def open_log(run_dir: Path, config: dict[str, Any]) -> EventLogReader | None:
        online = config.get("online") if isinstance(config, dict) else None
        serve = online.get("serve") if isinstance(online, dict) else None
        url = urls.get(run_dir.name) or (serve.get("db_url") if isinstance(serve, dict) else "") or ""
        if not url and (run_dir / DB_NAME).exists():
            url = str(run_dir / DB_NAME)
        return EventLogReader(url) if url else None

    return open_log


def run(args: argparse.Namespace) -> int:
    from flywheel.metrics.dashboard.server import serve

    root = Path(args.runs_dir)
    if not root.is_dir():
        raise SystemExit(f"flywheel dashboard: '{root}' is not a directory; pass the directory that holds your "
                         "runs (e.g. runs/) or one run directory")
    if not 0.05 <= args.poll_s <= 60:
        raise SystemExit("flywheel dashboard: --poll-s must be between 0.05 and 60 seconds")
    if not 1 <= args.online_window <= 100_000:
        raise SystemExit("flywheel dashboard: --online-window must be between 1 and 100000 feedback events")
    urls = parse_online_dbs(args.online_db, root)
    try:
        serve(root, args.host, args.port, args.token, args.poll_s, online_window=args.online_window,
              open_event_log=event_log_opener(urls), online_runs=frozenset(urls))
    except ValueError as err:
        raise SystemExit(f"flywheel dashboard: {err}") from None
    return 0
