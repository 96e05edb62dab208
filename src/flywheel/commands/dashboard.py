"""Serve the live dashboard over a directory of runs (or one run): charts, tiles, the rollout browser.

    flywheel dashboard runs/                       # http://127.0.0.1:8765/
    flywheel dashboard runs/demo --port 9000
    flywheel dashboard runs/ --host 0.0.0.0 --token "$(openssl rand -hex 16)"
    flywheel dashboard runs/online --online-window 64   # an online run (`flywheel serve`): deploys, accept rate

Read-only; loopback unless told otherwise, and then only with a token (metrics/dashboard/server.py).
"""

from __future__ import annotations

import argparse

HELP = "serve the live web dashboard of a runs directory (read-only)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs_dir", nargs="?", default="runs", help="a directory of run directories, or one run (default: runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; others need --token)")
    p.add_argument("--port", type=int, default=8765, help="TCP port (default 8765)")
    p.add_argument("--token", default=None, help="secret every request must carry (?token=… once, then a cookie)")
    p.add_argument("--poll-s", type=float, default=1.0, help="seconds between reads of what the runs appended")
    p.add_argument("--online-window", type=int, default=32,
                   help="an online run's live accept rate: over this many newest accept/reject events (default 32)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flywheel.metrics.dashboard.server import serve

    root = Path(args.runs_dir)
    if not root.is_dir():
        raise SystemExit(f"flywheel dashboard: '{root}' is not a directory; pass the directory that holds your "
                         "runs (e.g. runs/) or one run directory")
    if not 0.05 <= args.poll_s <= 60:
        raise SystemExit("flywheel dashboard: --poll-s must be between 0.05 and 60 seconds")
    if not 1 <= args.online_window <= 100_000:
        raise SystemExit("flywheel dashboard: --online-window must be between 1 and 100000 feedback events")
    try:
        serve(root, args.host, args.port, args.token, args.poll_s, online_window=args.online_window)
    except ValueError as err:
        raise SystemExit(f"flywheel dashboard: {err}") from None
    return 0
