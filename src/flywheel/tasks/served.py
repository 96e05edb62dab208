"""Tasks whose hidden tests live in a service: grading can pass only while the task's service is up.

    from flywheel.tasks.served import serve_hidden_tests
    task = serve_hidden_tests(synth_task)        # services = [{"kind": "command", ...}], same problem, same files
    save_tasks([serve_hidden_tests(t) for t in tasks], "served.jsonl")

Why: a service that is declared but never read proves nothing about the environment running it. Here the
hidden test files move into a small TCP service started per session in the task's network namespace
(`sandbox/services.py`, kind `command`: one Python process, no database). Each hidden test file is replaced by a
stub that fetches its real text from `127.0.0.1:PORT` when the grader imports it and runs it in the module's
namespace, so the test ids, the runner and the verdict are those of the original task; when the service is not
there (not started, already stopped, another session's namespace), the import fails and every hidden test
counts as failed. The agent sees the same problem and workspace as in the original task (hidden files never
enter the workspace), so a policy trained on the original tasks behaves the same on these.

Cost: one bubblewrap and one Python start per session (0.13 s p50 to ready on 2 cores at load 7), against 1.7 s
for a PostgreSQL cluster (docs/environments.md, "Services"), which is what makes an RL run of hundreds of
sessions with a service each affordable on two cores. What it does not exercise: a database's own start-up and
state; the migration task (`tasks/migration.py`) does. Nor the whole grading guard: it arms the stub, not the
served text, so the served tests need no signed proof and their asserts are not probed (envs/guard.py) — train on
served tasks to exercise services, not where a policy's reward hacks must be stopped.
Tests: `pytest tests/unit/test_served_tasks.py`.
"""

from __future__ import annotations

import base64
import dataclasses
import glob
import json
import os
from pathlib import Path

from flywheel.sandbox.workspace import default_tmp_root
from flywheel.tasks.loaders import RUNNER_FILE
from flywheel.types import Task

PORT = 7411
DATA_FILE = "served-tests.json"  # in the service's data directory: {hidden path: text}
MARKER = "flywheel-served-tests"  # in the service's command line, so a test can look for survivors

# The service: answer every connection with the JSON file and close it. The marker is an unused argv entry.
SERVER = f'''exec python3 - {MARKER} <<'FLYWHEEL_SERVER'
import socket
body = open("{DATA_FILE}", "rb").read()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT}))
s.listen(64)
while True:
    c, _ = s.accept()
    with c:
        c.sendall(body)
FLYWHEEL_SERVER'''

STUB = f'''"""This task's hidden tests are served by its live service (127.0.0.1:{PORT}); without it, this import fails."""
import json
import socket


def _served(path):
    with socket.create_connection(("127.0.0.1", {PORT}), timeout=10) as conn:
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks))[path]


exec(compile(_served(%r), __file__, "exec"))
'''


def serve_hidden_tests(task: Task) -> Task:
    """`task` with its hidden test files (all but the test runner) served by a per-session service."""
    if any(s.get("ready_port") == PORT for s in task.services):
        raise ValueError(f"task {task.id!r} already declares a service on port {PORT}")
    served = {path: text for path, text in task.hidden_files.items() if path != RUNNER_FILE and path.endswith(".py")}
    if not served:
        raise ValueError(f"task {task.id!r} has no hidden test files to serve")
    blob = base64.b64encode(json.dumps(served).encode()).decode()
    service = {"kind": "command", "name": "served-tests", "ready_port": PORT, "command": SERVER,
               "setup": f"echo {blob} | base64 -d > {DATA_FILE}", "memory_mb": 1024, "max_procs": 16}
    hidden = {**task.hidden_files, **{path: STUB % path for path in served}}
    # calls: [] — the point of a served task is a verdict that rests on the service, so it is graded from the
    # served test files (the in-process path), never by data (envs/calls.py), which would not need the service
    return dataclasses.replace(task, hidden_files=hidden, services=[*task.services, service], calls=[],
                               meta={**task.meta, "served_tests": sorted(served)})


def survivors(tmp_root: str | None = None) -> list[str]:
    """What is left of served-tests services on this machine: `pid N` for each process whose command line carries
    MARKER, and each data directory still holding DATA_FILE (under `tmp_root`, default the sandboxes' root).
    Empty once every session that started one is closed (tests check that none survives a run)."""
    left = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if MARKER.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    left.append(f"pid {name}")
            except OSError:
                pass
    return left + sorted(glob.glob(os.path.join(tmp_root or default_tmp_root(), "*", "*", DATA_FILE)))
