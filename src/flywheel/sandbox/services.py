"""Services of a task (a database, a cache): started in the task's own network namespace, torn down after.

    from flywheel.sandbox.services import parse_services, start_services
    specs = parse_services([{"kind": "postgres", "database": "app"}])     # ValueError names what to fix
    with start_services(specs) as svc:                                    # ready when this returns
        sb = create_sandbox(base, limits, netns=svc.netns, env=svc.env)   # its commands reach 127.0.0.1:5432
        ...
    # svc.close(): every service process killed, its data directory removed, the namespace handed back

Why here: a service is Linux plumbing like a sandbox — a long-lived process with a private data directory,
no network but the task's own loopback, a uid of its own — and knows nothing of tasks or grading. `envs/env.py`
starts a task's services at `reset`, runs the agent's commands and the hidden tests in their namespace
(so both see the same live database) and stops them at `close`.

How a service runs: one bubblewrap invocation in the prepared read-only root of `rootfs.py` (the system and the
Python installation read-only, a private /tmp), entered into the task's network namespace (`netns.py`: only a
loopback), with its private data directory bound at ``/workspace``, as a uid unique to the service (listed in a
private ``/etc/passwd`` bound over the host's: PostgreSQL refuses to run as root and looks its uid up) with
limits set by the exec helper. ``--die-with-parent`` and a pid namespace: when the owning process dies, even by
SIGKILL, the kernel kills every process of the service. The long-lived bwrap is started by one thread that
lives as long as the process (the parent-death signal follows the *thread* that forked, so a service started
from a short-lived worker thread would die with that thread). Steps, each a bash script in that view:
`setup` (once, before; e.g. initdb), `command` (the service itself, in the foreground), readiness (a TCP port on
127.0.0.1 that accepts connections, or `ready_command` exiting 0), `init` (once, after; e.g. load fixtures).

Kinds a task declares (`parse_service`): ``postgres`` (PostgreSQL of the Debian packages: `database`, `user`,
`port`, `init_sql`; clients get PGHOST, PGPORT, PGUSER, PGDATABASE and DATABASE_URL) and ``command`` (any
program: `name`, `command`, `setup`, `init`, `ready_port` or `ready_command`, `env`).

Data directories live under the sandbox directory (`default_tmp_root()`: the tmpfs /dev/shm by default; a fresh
PostgreSQL cluster is ~40 MB of it per session); `reap_stale_services` (run once per process) removes those of
owners that died. Needs root with network namespaces and a working bubblewrap (`available()`); elsewhere a task with services
gets a clear error. Tests: `pytest tests/unit/test_services.py`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.sandbox import netns
from flywheel.sandbox.host import UIDS, bwrap_available, kill_group, kill_uid, python_roots
from flywheel.sandbox.rootfs import EXEC_PATH, bwrap_system_args
from flywheel.sandbox.workspace import default_tmp_root

__all__ = ["ServiceError", "ServiceSpec", "TaskServices", "available", "parse_service", "parse_services",
           "postgres_bin", "reap_stale_services", "start_services"]

DATA = "/workspace"  # the service's data directory inside its view
_NAME_RX = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_IDENT_RX = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_ENV_RX = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_DIR_PREFIX = "flywheel-svc-"
_LOG_TAIL = 2000  # characters of a failed service's log quoted in the error


class ServiceError(RuntimeError):
    """A service did not start (its setup failed, it exited, or it was not ready in time)."""


@dataclass(frozen=True)
class ServiceSpec:
    """One service, as `parse_service` builds it from a task's declaration. Scripts are bash, run as the
    service's uid with cwd = its data directory (``/workspace``)."""

    name: str
    command: str  # runs in the foreground for the service's whole life
    setup: str = ""  # once before `command`
    init: str = ""  # once after the service is ready
    ready_port: int | None = None  # ready when 127.0.0.1:ready_port accepts a TCP connection
    ready_command: str = ""  # or: ready when this exits 0
    env: dict[str, str] = field(default_factory=dict)  # given to every command of the task's sandboxes
    start_timeout_s: float = 60.0
    memory_mb: int = 4096  # address-space limit per process of the service
    max_procs: int = 256


def _check_keys(d: dict[str, Any], allowed: set[str], what: str) -> None:
    unknown = set(d) - allowed
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")


def _int(d: dict[str, Any], key: str, default: int, lo: int, hi: int, what: str) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{what}: '{key}' must be an integer in [{lo}, {hi}] (got {v!r})")
    return v


def _text(d: dict[str, Any], key: str, what: str, default: str = "") -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or "\x00" in v:
        raise ValueError(f"{what}: '{key}' must be a string without NUL bytes (got {type(v).__name__})")
    return v


def _timeout(d: dict[str, Any], what: str) -> float:
    v = d.get("start_timeout_s", 60.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 3600:
        raise ValueError(f"{what}: 'start_timeout_s' must be a number of seconds in (0, 3600] (got {v!r})")
    return float(v)


def postgres_bin() -> str | None:
    """The directory of the newest installed PostgreSQL server (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4])
                   if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    exe = shutil.which("postgres")
    return os.path.dirname(os.path.realpath(exe)) if exe else None


def _postgres(d: dict[str, Any]) -> ServiceSpec:
    what = "service of kind 'postgres'"
    _check_keys(d, {"kind", "name", "database", "user", "port", "init_sql", "start_timeout_s"}, what)
    name, db, user = _text(d, "name", what, "postgres"), _text(d, "database", what, "app"), _text(d, "user", what, "app")
    for key, v in (("database", db), ("user", user)):
        if not _IDENT_RX.match(v):
            raise ValueError(f"{what}: '{key}' must be a lower-case SQL identifier (got {v!r})")
    port = _int(d, "port", 5432, 1, 65535, what)
    init_sql = _text(d, "init_sql", what)
    bindir = postgres_bin()
    if bindir is None:
        raise ValueError("a task declares a PostgreSQL service, but no PostgreSQL server is installed: "
                         "apt-get install postgresql (the Makefile's `make setup` does)")
    pg = shlex.quote(bindir)
    # Durability off (the data dir is thrown away): no fsync, no full-page writes; a small footprint.
    server = (f"exec {pg}/postgres -D {DATA}/pg -k /tmp -h 127.0.0.1 -p {port} -c fsync=off "
              "-c full_page_writes=off -c synchronous_commit=off -c shared_buffers=16MB -c max_connections=40 "
              "-c dynamic_shared_memory_type=mmap -c logging_collector=off")
    setup = f"{pg}/initdb -D {DATA}/pg -U {user} --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync -N >/dev/null"
    # The port accepts connections while the server still starts up ("the database system is starting up"):
    # wait until it takes queries, then create the database.
    init = (f"until {pg}/pg_isready -q -h 127.0.0.1 -p {port}; do sleep 0.05; done\n"
            f"{pg}/createdb -h 127.0.0.1 -p {port} -U {user} {db}")
    if init_sql:
        init += (f"\ncat > {DATA}/init.sql <<'FLYWHEEL_INIT_SQL'\n{init_sql}\nFLYWHEEL_INIT_SQL\n"
                 f"psql -v ON_ERROR_STOP=1 -q -h 127.0.0.1 -p {port} -U {user} -d {db} -f {DATA}/init.sql >/dev/null")
    env = {"PGHOST": "127.0.0.1", "PGPORT": str(port), "PGUSER": user, "PGDATABASE": db,
           "DATABASE_URL": f"postgresql://{user}@127.0.0.1:{port}/{db}"}
    return ServiceSpec(name=name, command=server, setup=setup, init=init, ready_port=port, env=env,
                       start_timeout_s=_timeout(d, what))


def _command(d: dict[str, Any]) -> ServiceSpec:
    what = "service of kind 'command'"
    _check_keys(d, {"kind", "name", "command", "setup", "init", "ready_port", "ready_command", "env",
                    "start_timeout_s", "memory_mb", "max_procs"}, what)
    command = _text(d, "command", what)
    if not command.strip():
        raise ValueError(f"{what}: 'command' (the program, run in the foreground) is required")
    port = d.get("ready_port")
    if port is not None:
        port = _int(d, "ready_port", 0, 1, 65535, what)
    ready = _text(d, "ready_command", what)
    if port is None and not ready.strip():
        raise ValueError(f"{what}: give 'ready_port' (a TCP port on 127.0.0.1) or 'ready_command' (exits 0 when "
                         "the service is ready)")
    env = d.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_RX.match(k) and isinstance(v, str)
                                            and "\x00" not in v for k, v in env.items()):
        raise ValueError(f"{what}: 'env' must map upper-case variable names to strings")
    return ServiceSpec(name=_text(d, "name", what, "service"), command=command, setup=_text(d, "setup", what),
                       init=_text(d, "init", what), ready_port=port, ready_command=ready, env=dict(env),
                       start_timeout_s=_timeout(d, what),
                       memory_mb=_int(d, "memory_mb", 4096, 64, 1_048_576, what),
                       max_procs=_int(d, "max_procs", 256, 4, 65_536, what))


KINDS = {"postgres": _postgres, "command": _command}


def parse_service(d: Any) -> ServiceSpec:
    """A task's service declaration (`{"kind": "postgres", ...}`) -> ServiceSpec; ValueError says what to fix."""
    if not isinstance(d, dict):
        raise ValueError(f"a service must be an object with a 'kind' (got {type(d).__name__})")
    kind = d.get("kind")
    if kind not in KINDS:
        raise ValueError(f"service kind must be one of {sorted(KINDS)} (got {kind!r})")
    spec = KINDS[kind](d)
    if not _NAME_RX.match(spec.name):
        raise ValueError(f"service name {spec.name!r} must match {_NAME_RX.pattern}")
    return spec


def parse_services(items: Any) -> list[ServiceSpec]:
    """A task's `services` list -> specs; names must be unique, and so must ready ports (one loopback)."""
    if not isinstance(items, list):
        raise ValueError(f"'services' must be a list of objects (got {type(items).__name__})")
    specs = [parse_service(d) for d in items]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"service names must be unique within a task (got {names}); set 'name'")
    ports = [s.ready_port for s in specs if s.ready_port is not None]
    if len(set(ports)) != len(ports):
        raise ValueError(f"services of one task share one loopback: ports must differ (got {ports})")
    return specs


def available() -> bool:
    """Whether services can run here: root with network namespaces, and a working bubblewrap."""
    return netns.available() and bwrap_available()


# ---------------------------------------------------------------------------------------------
# Running them

# One thread that lives as long as the process starts every long-lived service (see the module docstring).
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flywheel-services")
_LIVE: set[TaskServices] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_live() -> None:
    for svc in list(_LIVE):
        with contextlib.suppress(Exception):
            svc.close()


class _Running:
    """One started service: its bwrap process, uid, data directory and log."""

    def __init__(self, spec: ServiceSpec, uid: int, root: Path) -> None:
        self.spec, self.uid, self.root = spec, uid, root
        self.data = root / "data"
        self.log = root / "log"
        self.proc: subprocess.Popen | None = None

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return ""


class TaskServices:
    """The running services of one task session: `netns` (an fd; give it to `create_sandbox`) and `env`
    (the variables clients need). `close()` is idempotent; a context manager."""

    def __init__(self, specs: list[ServiceSpec], tmp_root: str | None = None) -> None:
        if specs and not available():
            raise ServiceError("this task declares services, which need root with network namespaces and a working "
                               "bubblewrap (apt-get install bubblewrap); run it as root, or drop the task")
        self.specs = list(specs)
        self.env: dict[str, str] = {k: v for s in specs for k, v in s.env.items()}
        self.tmp_root = tmp_root or default_tmp_root()
        _reap_once(self.tmp_root)  # what owners killed by SIGKILL left (their services died with them)
        self.netns: int | None = netns.fresh() if specs else None
        self.running: list[_Running] = []
        self._closed = False
        self._owner_pid = os.getpid()
        with _LIVE_LOCK:
            _LIVE.add(self)

    # -- the view every step of a service runs in
    def _argv(self, svc: _Running, script: str) -> list[str]:
        system, helper = bwrap_system_args(shutil.which("bwrap") or "bwrap", self.tmp_root, 256 << 20,
                                           python_roots()[0])
        spec = svc.spec
        a = [x for x in system if x != "--unshare-net"]  # the task's namespace is entered instead
        a += ["--bind", str(svc.data), DATA, "--ro-bind", str(svc.root / "passwd"), "/etc/passwd",
              "--ro-bind", str(svc.root / "group"), "/etc/group", "--chdir", DATA, "--"]
        if helper:
            return a + [EXEC_PATH, str(svc.uid), str(10**9), str(spec.memory_mb << 20), str(spec.max_procs),
                        str(1 << 40), "/bin/bash", "bash", "-c", script]
        limits = f"ulimit -v {spec.memory_mb * 1024} -u {spec.max_procs} || exit 125\n"
        return a + ["setpriv", f"--reuid={svc.uid}", f"--regid={svc.uid}", "--clear-groups", "--no-new-privs",
                    "bash", "-c", limits + script]

    def _env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": DATA, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "TMPDIR": "/tmp", **self.env}

    def _popen(self, svc: _Running, script: str) -> subprocess.Popen:
        assert self.netns is not None
        with open(svc.log, "ab") as log, netns.entered(self.netns):
            return subprocess.Popen(self._argv(svc, script), env=self._env(), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def _run_step(self, svc: _Running, script: str, what: str, deadline: float) -> None:
        proc = self._popen(svc, script)
        try:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _killpg(proc)
            raise ServiceError(f"service {svc.spec.name!r}: {what} did not finish within "
                               f"{svc.spec.start_timeout_s:g}s; log:\n{svc.log_tail()}") from None
        if rc != 0:
            raise ServiceError(f"service {svc.spec.name!r}: {what} failed (exit {rc}); log:\n{svc.log_tail()}")

    def _port_open(self, port: int) -> bool:
        assert self.netns is not None
        with netns.entered(self.netns):  # a socket belongs to the namespace it was made in
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.settimeout(1.0)
            s.connect(("127.0.0.1", port))
            return True
        except OSError:
            return False
        finally:
            s.close()

    def _probe(self, svc: _Running, deadline: float) -> bool:
        """`ready_command` exits 0 (a probe still running at the deadline is killed: not ready)."""
        proc = self._popen(svc, svc.spec.ready_command)
        try:
            return proc.wait(timeout=max(0.1, deadline - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            _killpg(proc)
            return False

    def _start_one(self, spec: ServiceSpec) -> None:
        uid = UIDS.acquire()
        root = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=self.tmp_root))
        svc = _Running(spec, uid, root)
        self.running.append(svc)
        os.chmod(root, 0o700)
        svc.data.mkdir(mode=0o700)
        os.chown(svc.data, uid, uid)
        (root / "passwd").write_text(Path("/etc/passwd").read_text() + f"service:x:{uid}:{uid}::{DATA}:/bin/bash\n")
        (root / "group").write_text(Path("/etc/group").read_text() + f"service:x:{uid}:\n")
        for f in ("passwd", "group"):
            os.chmod(root / f, 0o644)
        deadline = time.monotonic() + spec.start_timeout_s
        if spec.setup.strip():
            self._run_step(svc, spec.setup, "setup", deadline)
        svc.proc = _SPAWNER.submit(self._popen, svc, spec.command).result()
        while True:
            if svc.proc.poll() is not None:
                raise ServiceError(f"service {spec.name!r} exited (status {svc.proc.returncode}) before it was "
                                   f"ready; log:\n{svc.log_tail()}")
            ready = self._port_open(spec.ready_port) if spec.ready_port is not None else self._probe(svc, deadline)
            if ready:
                break
            if time.monotonic() > deadline:
                raise ServiceError(f"service {spec.name!r} was not ready within {spec.start_timeout_s:g}s; "
                                   f"log:\n{svc.log_tail()}")
            time.sleep(0.02)
        if spec.init.strip():
            self._run_step(svc, spec.init, "init", deadline)

    def start(self) -> TaskServices:
        """Start every service in order (each ready before the next); on any failure all are stopped."""
        try:
            for spec in self.specs:
                self._start_one(spec)
        except BaseException:
            self.close()
            raise
        return self

    def pids(self) -> list[int]:
        """Host pids of every process of the services (for tests and diagnostics)."""
        uids = {s.uid for s in self.running}
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{name}").st_uid in uids:
                        out.append(int(name))
        return out

    def close(self) -> None:
        """Kill every process of every service, remove the data directories, hand back uids and namespace."""
        if self._closed:
            return
        self._closed = True
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if os.getpid() != self._owner_pid:  # a forked copy: the services are the parent's
            return
        for svc in self.running:
            if svc.proc is not None:
                _killpg(svc.proc)  # bwrap's pid namespace dies with it, and every process inside
            kill_uid(svc.uid)  # and whatever of that uid is left anywhere
            shutil.rmtree(svc.root, ignore_errors=True)
            UIDS.release(svc.uid)
        self.running = []
        if self.netns is not None:
            # Not back to the pool: the kernel finishes killing a pid namespace asynchronously, and a server still
            # dying there would hold its port against the next session's. The namespace goes with its last process.
            os.close(self.netns)
            self.netns = None

    def __enter__(self) -> TaskServices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _killpg(proc: subprocess.Popen) -> None:
    kill_group(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def start_services(specs: list[ServiceSpec], tmp_root: str | None = None) -> TaskServices:
    """Start `specs` in a new network namespace; returns once all are ready (ServiceError if one is not)."""
    return TaskServices(specs, tmp_root).start()


@functools.lru_cache(maxsize=8)
def _reap_once(tmp_root: str) -> int:
    return reap_stale_services(tmp_root) if os.geteuid() == 0 else 0


def reap_stale_services(tmp_root: str | None = None) -> int:
    """Remove service directories whose owner process is gone (its services died with it); returns how many."""
    root = tmp_root or default_tmp_root()
    live = {int(n) for n in os.listdir("/proc") if n.isdigit()}
    removed = 0
    for e in os.scandir(root):
        if e.name.startswith(_DIR_PREFIX):
            head = e.name[len(_DIR_PREFIX):].split("-", 1)[0]
            if head.isdigit() and int(head) not in live:
                shutil.rmtree(e.path, ignore_errors=True)
                removed += 1
    return removed
