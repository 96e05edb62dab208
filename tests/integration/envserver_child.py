"""A `flywheel env-server` child process for the tests that run RL through one (test_remote_rl.py,
test_remote_learns.py): started on a free loopback port, its URL read from the line it prints, SIGTERMed after.

    with env_server(tmp_path / "srv", "configs/demo.toml") as url:   # $FLYWHEEL_ENV_TOKEN must be set
        ... cfg with f"--env.remote_url={url}" ...
        counters = server_info(url)                                   # GET /v1/info: sessions, steps, grades, ...
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

TOKEN = "remote-rl-token-0123456789"


@contextlib.contextmanager
def env_server(cache_dir: Path, *args: str) -> Iterator[str]:
    """`args`: the server's CONFIG and overrides. The caller sets FLYWHEEL_ENV_TOKEN (the node process reads it too)."""
    proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "env-server", "--port", "0", "--cache-dir",
                             str(cache_dir), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "listening on" in line, line + (proc.stdout.read() if proc.stdout and proc.poll() is not None else "")
        yield line.split("listening on ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(10)


def server_info(url: str) -> dict:
    """The server's GET /v1/info: its env config and counters (sessions, steps, grades, env_errors, ...)."""
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/info", headers={"Authorization": f"Bearer {os.environ['FLYWHEEL_ENV_TOKEN']}"})
    return json.loads(conn.getresponse().read())
