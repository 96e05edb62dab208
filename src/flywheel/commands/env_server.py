"""Serve coding environments over HTTP for trainers that run elsewhere (envs/remote_server.py).

    FLYWHEEL_ENV_TOKEN=$(openssl rand -hex 16) flywheel env-server --port 8780
    flywheel env-server configs/demo.toml --tasks tasks.jsonl --host 0.0.0.0 --port 8780 --token-file token.txt
    # the trainer's side: env.remote_url = "http://this-host:8780", the same token in $FLYWHEEL_ENV_TOKEN

The env section of CONFIG (default: the built-in defaults) sets the sandbox, limits and reward of every session.
Prints `flywheel env-server: listening on URL` once it accepts connections (port 0: a free port).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NAME = "env-server"
HELP = "serve coding environments (reset, step, grade) over HTTP"
ACCEPTS_OVERRIDES = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None, help="TOML config whose [env] section the sessions use")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8780, help="port (0: a free one, printed)")
    p.add_argument("--tasks", default=None, help="serve this task file's tasks by id (clients send only task_id)")
    p.add_argument("--token-file", default=None, help="file holding the token (default: $FLYWHEEL_ENV_TOKEN)")
    p.add_argument("--cache-dir", default=None, help="where task workspaces are materialised (default: a temp dir)")
    p.add_argument("--max-sessions", type=int, default=64, help="sessions open at once; more get 503")
    p.add_argument("--idle-timeout-s", type=float, default=600.0, help="a session untouched this long is closed")
    p.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body; larger get 413")
    p.add_argument("--skip-broken", action="store_true", help="serve the usable tasks of a --tasks file with broken "
                   "lines (default: refuse the file)")


def run(args: argparse.Namespace) -> int:
    import asyncio
    import tempfile

    from flywheel.config import UserError, load_config
    from flywheel.envs.remote_server import EnvServer
    from flywheel.tasks.loaders import load_tasks

    cfg = load_config(args.config, args.overrides)
    if args.token_file:
        if not Path(args.token_file).is_file():
            raise UserError(f"--token-file {args.token_file}: no such file; write the token there first (e.g. "
                            f"`openssl rand -hex 16 > {args.token_file}`), or set $FLYWHEEL_ENV_TOKEN")
        token = Path(args.token_file).read_text().strip()
    else:
        token = os.environ.get("FLYWHEEL_ENV_TOKEN", "")
    if len(token) < 8:
        print("flywheel env-server: set a token of at least 8 characters in $FLYWHEEL_ENV_TOKEN or --token-file",
              file=sys.stderr)
        return 2
    tasks = None
    if args.tasks:
        load = load_tasks(args.tasks)
        if not args.skip_broken:
            load.refuse_broken(args.tasks, "serve")
        for e in load.errors:
            print(f"flywheel env-server: skipping broken task {e}", file=sys.stderr)
        tasks = {t.id: t for t in load.tasks}
    cache = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="flywheel-env-server-"))
    server = EnvServer(cfg.env, cache, token, tasks=tasks, host=args.host, port=args.port,
                       max_sessions=args.max_sessions, idle_timeout_s=args.idle_timeout_s,
                       max_body_mb=args.max_body_mb)

    def ready(url: str) -> None:
        print(f"flywheel env-server: listening on {url}", flush=True)

    try:
        asyncio.run(server.serve_forever(ready))
    except KeyboardInterrupt:
        pass
    return 0
