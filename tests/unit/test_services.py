"""Services of a task (`sandbox/services.py`): a real PostgreSQL in the task's network namespace, reachable from
the task's sandboxes and from nowhere else, torn down with nothing left (also when its owner is SIGKILLed); the
migration task (`tasks/migration.py`) graded through the real path: the reference fix earns 1, the untouched tree
and a migration written but never applied 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.sandbox import services
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox, flush_closed, materialize_base
from flywheel.sandbox.services import ServiceError, parse_service, parse_services, start_services
from flywheel.tasks.loaders import BrokenTask, parse_flywheel, task_to_dict
from flywheel.tasks.migration import migration_task, reference_actions
from flywheel.types import ToolCall

needs_services = pytest.mark.skipif(not services.available() or services.postgres_bin() is None,
                                    reason="needs root, network namespaces, bubblewrap and PostgreSQL "
                                           "(make setup installs it)")
PG = [{"kind": "postgres", "database": "shop", "user": "clerk", "init_sql": "CREATE TABLE t (x int); "
       "INSERT INTO t VALUES (41);"}]


def _uid_procs(uids: set[int]) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid in uids:
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("bad, fix", [
    ({"kind": "mysql"}, "service kind must be one of"),
    ({"kind": "postgres", "database": "Robert'); DROP"}, "'database' must be a lower-case SQL identifier"),
    ({"kind": "postgres", "port": 0}, "'port' must be an integer in [1, 65535]"),
    ({"kind": "postgres", "colour": "red"}, "unknown keys ['colour']"),
    ({"kind": "command", "command": "redis-server"}, "give 'ready_port'"),
    ({"kind": "command", "command": "x", "ready_port": 1, "env": {"lower": "x"}}, "'env' must map upper-case"),
    ({"kind": "command", "command": "x", "ready_port": 1, "name": "Bad Name"}, "service name"),
    ("postgres", "must be an object"),
])
def test_bad_declarations_name_what_to_fix(bad, fix) -> None:
    with pytest.raises(ValueError, match=None) as err:
        parse_service(bad)
    assert fix in str(err.value)


def test_a_task_file_line_with_bad_services_is_a_broken_task() -> None:
    d = task_to_dict(migration_task())
    d["services"] = [{"kind": "postgres"}, {"kind": "postgres"}]  # same name, same port
    with pytest.raises(BrokenTask, match="names must be unique"):
        parse_flywheel(d)
    d["services"] = [{"kind": "postgres", "name": "a"}, {"kind": "postgres", "name": "b"}]
    with pytest.raises(BrokenTask, match="ports must differ"):
        parse_flywheel(d)
    assert parse_flywheel(task_to_dict(migration_task())).services == migration_task().services


@needs_services
def test_postgres_is_reachable_from_the_tasks_sandboxes_only_and_leaves_nothing(tmp_path: Path) -> None:
    base = materialize_base({"q.sh": "psql -Atc 'SELECT x + 1 FROM t'\n"}, tmp_path / "base")
    svc = start_services(parse_services(PG))
    uids = {r.uid for r in svc.running}
    dirs = [r.root for r in svc.running]
    try:
        assert _uid_procs(uids), "the server runs as the service's own uid"
        with create_sandbox(base, SandboxLimits(), netns_fd=svc.netns, env=svc.env) as sb:
            r = sb.run("bash q.sh")
            assert (r.returncode, r.stdout.strip()) == (0, "42"), r.output
            assert sb.run("echo $DATABASE_URL").stdout.strip() == "postgresql://clerk@127.0.0.1:5432/shop"
        with create_sandbox(base, SandboxLimits(), env=svc.env) as other:  # a sandbox of its own namespace
            r = other.run("bash q.sh")
            assert r.returncode != 0 and "Connection refused" in r.output
        r = subprocess.run(["psql", "-h", "127.0.0.1", "-p", "5432", "-U", "clerk", "-d", "shop", "-c", "select 1"],
                           capture_output=True, text=True, timeout=10)
        assert "Connection refused" in r.stderr or r.returncode != 0  # nor from the host
    finally:
        svc.close()
        flush_closed()
    assert _uid_procs(uids) == [] and not any(d.exists() for d in dirs)
    assert svc.netns is None and svc.running == []


@needs_services
def test_a_command_service_that_dies_or_never_gets_ready_is_a_clear_error() -> None:
    dies = parse_services([{"kind": "command", "command": "echo boom; exit 3", "ready_port": 9000}])
    with pytest.raises(ServiceError, match=r"(?s)exited \(status 3\).*boom"):
        start_services(dies)
    slow = parse_services([{"kind": "command", "command": "sleep 60", "ready_port": 9000, "start_timeout_s": 0.5}])
    t0 = time.monotonic()
    with pytest.raises(ServiceError, match="not ready within 0.5s"):
        start_services(slow)
    assert time.monotonic() - t0 < 5
    never = parse_services([{"kind": "command", "command": "sleep 60", "ready_command": "sleep 30",
                             "start_timeout_s": 0.5}])
    with pytest.raises(ServiceError, match="not ready within 0.5s"):
        start_services(never)  # a probe that hangs is killed at the deadline
    assert time.monotonic() - t0 < 10


@needs_services
def test_a_generic_command_service_serves_the_task(tmp_path: Path) -> None:
    spec = parse_services([{"kind": "command", "name": "web", "ready_port": 8000, "env": {"WEB": "http://127.0.0.1:8000"},
                            "setup": "echo hello > index.txt",
                            "command": "exec python3 -m http.server 8000 --bind 127.0.0.1"}])
    base = materialize_base({"a": ""}, tmp_path / "base")
    with start_services(spec) as svc, create_sandbox(base, netns_fd=svc.netns, env=svc.env) as sb:
        r = sb.run("python3 -c \"import os, urllib.request; print(urllib.request.urlopen(os.environ['WEB'] + "
                   "'/index.txt').read().decode())\"")
        assert r.stdout.strip() == "hello", r.output
    flush_closed()


OWNER = textwrap.dedent("""
    import sys, time
    from flywheel.sandbox.services import parse_services, start_services
    svc = start_services(parse_services([{"kind": "postgres"}]))
    print(" ".join(str(r.uid) for r in svc.running), svc.running[0].root, flush=True)
    time.sleep(600)
""")


@needs_services
def test_services_die_with_their_owner_under_sigkill(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()  # type: ignore[union-attr]
        assert line, "the owner did not start its services"
        uids, root = {int(line[0])}, Path(line[1])
        assert _uid_procs(uids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _uid_procs(uids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _uid_procs(uids) == []  # the parent-death signal took the whole pid namespace
        assert services.reap_stale_services(str(root.parent)) >= 1 and not root.exists()
    finally:
        if proc.poll() is None:
            proc.kill()


@needs_services
def test_migration_task_reference_fix_earns_1_untouched_and_unapplied_0(tmp_path: Path) -> None:
    task = migration_task()
    cfg = EnvConfig()
    seen: set[int] = set()

    def session(calls: list[ToolCall]) -> float:
        with CodingEnv(cfg, tmp_path / "cache") as env:
            env.reset(task)
            assert env.services is not None
            seen.update(r.uid for r in env.services.running)
            for c in calls:
                obs, _ = env.step([c])
                assert not obs[0].content.startswith("Error"), obs[0].content
            return env.grade().value

    assert session(reference_actions(task)) == 1.0
    assert session([ToolCall("submit", {})]) == 0.0
    written_only = [c for c in reference_actions(task) if c.name != "bash"]
    assert session(written_only) == 0.0  # the hidden tests query the live database, not the files
    flush_closed()
    assert _uid_procs(seen) == []
