"""Sandboxes: run an agent's shell commands in a private copy-on-write workspace, with limits.

    from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox, materialize_base
    base = materialize_base(task.files)                 # once per task
    with create_sandbox(base, SandboxLimits(), kind="auto") as sb:
        r = sb.run("python -m pytest -q", timeout_s=30)  # bash -c, cwd = the workspace
        print(r.returncode, r.output)

Benchmark: `flywheel bench sandbox --out FILE`; tests: `pytest tests/unit/test_sandbox.py`.

Two kinds, both giving a private workspace per sandbox (`workspace.py`: an overlayfs view of the
task's base, O(1) to create; a copy where overlay cannot be mounted) and both enforcing, per command,
CPU time, address space, process count and file size limits (setrlimit, soft = hard: for bwrap by a
tiny exec helper, see `rootfs.py`; otherwise bash `ulimit` as the first statement of the sandboxed
shell) and a wall-clock timeout that SIGKILLs the whole process group. `close()` kills every process
at once and hands unmounting and removal to background threads (`flush_closed()` waits for them).

``bwrap`` (bubblewrap; default where installed and working). Each `run` is one bwrap invocation
(create to close: 1.5-1.9x a bare `bwrap --ro-bind / / true` here) with new network, pid, ipc, uts
and cgroup namespaces and ``--die-with-parent``; the command runs as a per-sandbox uid with no
capabilities and no_new_privs.
The system view is one ``--dev-bind`` of a read-only root prepared once per process (`rootfs.py`):
bwrap parses the host's whole mount table for every bind it makes, so fewer binds is what made it fast.
  Covers: no network (a network namespace holding only its own loopback: as root one lent for the
  sandbox's life by `netns.py` or the task's own where its services run (`services.py`), else a fresh one per
  command); read-only system (/usr, /etc and the
  Python installation bound read-only, nothing else of the host visible: not /root, not /work, not
  other sandboxes, not the task base); the workspace (at ``/workspace``) and a private tmpfs /tmp are
  the only writable paths; every process the command started dies with it (pid-namespace teardown),
  including daemons that called setsid; fork bombs stop at `max_procs`; memory bombs get ENOMEM.
  Does not cover: kernel exploits (the kernel is shared; no seccomp filter), CPU *share* (a command
  may use all cores until its CPU-time limit), disk quotas beyond the per-file size limit, timing
  side channels, reading world-readable files under /usr and /etc.

``local`` (fallback: a subprocess with cwd in the private workspace, TMPDIR in a private temp dir).
  When running as root it still gets most of the above cheaply: the command runs under
  ``unshare --net`` (no network) and as a per-sandbox unprivileged uid (``setpriv``), so it cannot
  write root-owned paths (the system, the task base, other sandboxes), the process-count limit is
  per sandbox, and `close()` kills every process of that uid, setsid'd daemons included. Where the
  interpreter lies in a private directory (a pyenv under /root), each command gets a private mount
  namespace in which read-only binds of the Python roots cover that directory. Commands die with their owner
  even when it is SIGKILLed: each command's process group (and, as root, the sandbox uid) is registered with the
  owner's lifeline (`lifeline.py`), which kills them when the owner is gone.
  Does not cover: it sees the whole host file system read-only-by-permissions, may write
  world-writable places (/tmp, /dev/shm), and without root it has the network, runs as the calling
  user (can write anything the user can, including the base), counts `max_procs` against all of that
  user's processes, and a process that escapes the process group with setsid survives `close()`.

Why a per-sandbox uid (as root): root ignores RLIMIT_NPROC, so a fork bomb run as root is not
contained by rlimits; a shared unprivileged uid would make 200 concurrent sandboxes share one process
budget. A uid unique to the sandbox (1e9 + pid*1e4 + slot, never in /etc/passwd) gives each sandbox its
own budget and a kill switch (every process of that uid). Files the sandbox creates belong to that uid;
root on the host reads and writes them as usual. Without root (not exercised here: CI runs as root),
bwrap runs in a user namespace as the calling user, and RLIMIT_NPROC counts the processes of that
user namespace.

Python inside bwrap: the running interpreter's prefix (the venv, with pytest) and its base
installation are bound read-only at their host paths and the venv's bin/ is first on PATH, so
`python -m pytest` works the same inside and outside; /usr/bin/python3 is there too.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import functools
import json
import os
import select
import shutil
import subprocess
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from flywheel.sandbox import netns
from flywheel.sandbox.contract import ExecResult, Sandbox, SandboxLimits
from flywheel.sandbox.direct_exec import direct_argv
from flywheel.sandbox.host import (
    KINDS,
    UIDS,
    bwrap_available,
    default_path,
    is_root,
    kill_group,
    kill_uid,
    memfd,
    python_roots,
    python_view_fstab,
    read_capped,
    resolve_kind,
)
from flywheel.sandbox.lifeline import LIFELINE
from flywheel.sandbox.rootfs import EXEC_PATH, bwrap_system_args, reap_stale
from flywheel.sandbox.workspace import (
    Workspace,
    close_in_background,
    default_tmp_root,
    flush_closed,
    materialize_base,
    workspace_mode,
)

__all__ = [
    "ExecResult", "Sandbox", "SandboxLimits", "BwrapSandbox", "LocalSandbox", "bwrap_available",
    "create_sandbox", "flush_closed", "materialize_base", "resolve_kind", "KINDS",
]

BWRAP_WORKSPACE = "/workspace"
BWRAP_PYTHON_ENV = "/env"  # where a task's own Python environment (a venv) is bound, read-only


_LIVE: weakref.WeakSet = weakref.WeakSet()  # sandboxes not yet closed: closed at interpreter exit


def num_open() -> int:
    """Sandboxes of this process that were started and not yet closed (a leak shows as a count that grows)."""
    return sum(1 for sb in list(_LIVE) if not sb._closed)


@atexit.register
def _close_live() -> None:
    for sb in list(_LIVE):
        try:
            sb.close()
        except Exception:  # noqa: BLE001 - best effort at exit; nothing to report to
            pass
    try:
        flush_closed(10)
    except Exception:  # noqa: BLE001, S110 - best effort at exit
        pass


@functools.lru_cache(maxsize=8)
def _reap_once(tmp_root: str) -> int:
    """Once per process and directory: remove what killed processes left (see `rootfs.reap_stale`)."""
    return reap_stale(tmp_root)


# ---------------------------------------------------------------------------------------------
# Sandboxes


class _BaseSandbox(abc.ABC):
    kind = ""
    _lifeline = False  # register commands (and the uid) with this process's lifeline: kinds without --die-with-parent

    def __init__(self, base: Path, limits: SandboxLimits, tmp_root: str | None = None,
                 python_env: str | Path | None = None, *, netns_fd: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits (got {type(limits).__name__})")
        if netns_fd is not None and not netns.available():
            raise ValueError("a sandbox in a given network namespace (a task's services) needs root with network "
                             "namespaces")
        self.limits = limits
        if python_env is not None and not (Path(python_env) / "bin" / "python").exists():
            raise ValueError(f"python_env {python_env} is not a virtual environment (no bin/python): build it with "
                             "`flywheel envs build TASKS`")
        self.python_env = None if python_env is None else os.path.realpath(python_env)  # on the host
        self.inner_python_env = self.python_env  # as commands inside see it
        self._given_netns = netns_fd  # the task's own namespace (services live there); not ours to release
        self._env(env, home="", tmp="")  # checks it
        self._base_env = dict(env or {})
        self._owner_pid = os.getpid()  # a forked child inherits this object but must not tear it down
        _reap_once(tmp_root or default_tmp_root())
        self.uid = UIDS.acquire() if is_root() else None
        if self.uid is not None and self._lifeline:
            LIFELINE.track_uid(self.uid)
        self._lock = threading.Lock()
        self._num_runs = 0
        self._running: set[int] = set()  # process groups of commands in flight
        self._closed = False
        try:
            self._ws = Workspace(base, owner_uid=self.uid, tmp_root=tmp_root)
        except BaseException:
            if self.uid is not None:
                if self._lifeline:
                    LIFELINE.untrack_uid(self.uid)
                UIDS.release(self.uid)
            raise
        self.workspace = self._ws.path
        self.inner_workspace = str(self.workspace)
        _LIVE.add(self)

    # The script bash runs: limits first (hard and soft, so the command cannot raise them), then the command.
    def _script(self, command: str) -> str:
        lim = self.limits
        return (f"ulimit -t {lim.cpu_time_s} -v {lim.memory_mb * 1024} -u {lim.max_procs} "
                f"-f {lim.file_size_mb * 1024} || exit 125\n{command}")

    def _setpriv(self) -> list[str]:
        if self.uid is None:
            return []
        # setresuid(U, U, U) from root clears the permitted, effective and ambient capabilities; with
        # no_new_privs no setuid binary or file capability can give any back.
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs"]

    def _env(self, env: dict[str, str] | None, home: str, tmp: str) -> dict[str, str]:
        out = {"PATH": default_path(), "HOME": home, "TMPDIR": tmp,
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb"}
        if self.inner_python_env is not None:  # the task's environment first: its `python` runs the tests
            out["PATH"] = f"{self.inner_python_env}/bin:{out['PATH']}"
            out["VIRTUAL_ENV"] = self.inner_python_env
        if env is not None:
            if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                                                    and "\x00" not in k + v for k, v in env.items()):
                raise TypeError("env must be a dict of str -> str with names free of '=' and NUL bytes")
            out.update(env)
        return out

    _wants_info_fd = False  # bwrap reports its namespace's pid 1 on this fd

    @abc.abstractmethod
    def _argv(self, script: str, info_fd: int, path: str) -> list[str]:
        """The command line that runs `bash -c script` inside this kind of sandbox (`path`: its PATH)."""

    @abc.abstractmethod
    def _run_env(self, env: dict[str, str] | None) -> dict[str, str]:
        """The environment of the sandboxed command (`env` merged over the defaults)."""

    def _cwd(self) -> str:
        return str(self.workspace)

    def _spawning(self) -> contextlib.AbstractContextManager:
        """Around starting a command: where it is born (bwrap: the sandbox's network namespace)."""
        return contextlib.nullcontext()

    def _released(self) -> None:
        """After close, once the workspace is gone: give back what the sandbox held."""
        if self.uid is not None:
            if self._lifeline:
                LIFELINE.untrack_uid(self.uid)
            UIDS.release(self.uid)

    def _kill_leftovers(self) -> None:
        """At close: kill what may outlive a command's process group (kinds without a pid namespace)."""
        if self.uid is not None:
            kill_uid(self.uid)

    def _after_timeout(self, info_r: int) -> None:  # noqa: B027 - a hook: the local kind needs nothing more
        """Make sure nothing of a killed command is left (`info_r`: bwrap's info pipe, or -1)."""

    def _start(self, command: str, env: dict[str, str] | None, stdin, stdout, stderr,
               info_w: int) -> subprocess.Popen:
        """`bash -c command` (limits first) in its own process group, registered so that close() kills it."""
        if not isinstance(command, str):
            raise TypeError(f"command must be a str (got {type(command).__name__})")
        if "\x00" in command:
            raise ValueError("command may not contain NUL bytes")
        with self._lock:
            if self._closed:
                raise ValueError("this sandbox is closed; create a new one")
            self._num_runs += 1
        # the sandbox's own variables (a task's services: PGHOST, ...) under the call's
        run_env = self._run_env({**self._base_env, **(env or {})} if self._base_env else env)
        if self._lifeline:
            LIFELINE.ensure()  # running before the command does: registering it is then one write
        try:
            with self._spawning():
                proc = subprocess.Popen(self._argv(self._script(command), info_w, run_env["PATH"]), cwd=self._cwd(),
                                        env=run_env, stdin=stdin, stdout=stdout, stderr=stderr,
                                        start_new_session=True, close_fds=True,
                                        pass_fds=(info_w,) if info_w >= 0 else ())
        finally:
            if info_w >= 0:
                os.close(info_w)
        self._running.add(proc.pid)
        if self._lifeline:
            LIFELINE.track_group(proc.pid)
        return proc

    def _stop(self, proc: subprocess.Popen) -> None:
        """Kill what is left of `proc`'s process group (no-op for bwrap: the pid namespace is gone) and forget it."""
        kill_group(proc.pid)
        self._running.discard(proc.pid)
        if self._lifeline:
            LIFELINE.untrack_group(proc.pid)

    def run(self, command: str, timeout_s: float | None = None, stdin: str | None = None,
            env: dict[str, str] | None = None) -> ExecResult:
        """`bash -c command` in the workspace; never raises for what the command does."""
        if stdin is not None and not isinstance(stdin, str):
            raise TypeError(f"stdin must be a str or None (got {type(stdin).__name__})")
        timeout = self.limits.timeout_s if timeout_s is None else timeout_s
        if not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds (got {timeout_s!r})")
        # Output goes to memfds, not pipes: a background process that keeps stdout open does not make
        # us wait for the timeout, and there is no file to create and unlink per command.
        fds = [memfd("stdout"), memfd("stderr")]
        in_fd = subprocess.DEVNULL if stdin is None else memfd("stdin", stdin)
        if stdin is not None:
            fds.append(in_fd)
        info_r, info_w = os.pipe() if self._wants_info_fd else (-1, -1)
        t0 = time.perf_counter()
        timed_out = False
        try:
            proc = self._start(command, env, in_fd, fds[0], fds[1], info_w)
            try:
                if not _wait(proc, timeout):
                    timed_out = True
                    kill_group(proc.pid)
                    proc.wait()
                    self._after_timeout(info_r)
            finally:  # also on KeyboardInterrupt: the command does not outlive the call
                self._stop(proc)
            duration = time.perf_counter() - t0
            return ExecResult(proc.returncode, read_capped(fds[0]), read_capped(fds[1]), timed_out, duration)
        finally:
            for fd in fds:
                os.close(fd)
            if info_r >= 0:
                os.close(info_r)

    @contextlib.contextmanager
    def process(self, command: str, env: dict[str, str] | None = None, *, stdin: int = subprocess.PIPE,
                stdout: int = subprocess.PIPE, stderr: int = subprocess.DEVNULL) -> Iterator[subprocess.Popen]:
        """`bash -c command` in the workspace, alive while the block runs: a conversation with a command
        (envs/checks.py). stdin and stdout are pipes to this process and stderr is dropped, unless the caller
        passes file descriptors of its own (a pipe to another sandbox's process). The caller keeps its own
        deadline; leaving the block kills the command and everything it started."""
        info_r, info_w = os.pipe() if self._wants_info_fd else (-1, -1)
        try:
            proc = self._start(command, env, stdin, stdout, stderr, info_w)
            try:
                yield proc
            finally:
                kill_group(proc.pid)
                proc.wait()
                self._after_timeout(info_r)
                self._stop(proc)
                for pipe in (proc.stdin, proc.stdout):
                    if pipe is not None:
                        with contextlib.suppress(OSError):
                            pipe.close()
        finally:
            if info_r >= 0:
                os.close(info_r)

    def close(self) -> None:
        """Kill everything now; unmount and remove the directories in the background (`flush_closed`
        waits for that). Idempotent. In a forked child, closing an inherited sandbox only marks it closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._owner_pid:  # a forked copy: the processes and mounts are the parent's
            return
        try:
            for pgid in list(self._running):
                kill_group(pgid)
            self._kill_leftovers()
        finally:
            close_in_background(self._ws, self._released)

    @property
    def workspace_mode(self) -> str:
        return self._ws.mode

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; callers should close()
        try:
            if not self._closed and hasattr(self, "_ws"):
                self.close()
        except Exception:
            pass


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for `proc` up to `timeout_s`; True when it exited. A pidfd wakes us the moment it exits
    (Popen.wait(timeout) polls with sleeps that grow to 50 ms, which would dominate a 10 ms sandbox)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ready = poller.poll(max(1, int(timeout_s * 1000)))
    finally:
        os.close(fd)
    if not ready:
        return False
    proc.wait()
    return True


def bwrap_view_args(tmp_root: str, tmp_bytes: int) -> tuple[tuple[str, ...], bool]:
    """bwrap's arguments for the system view of this process's sandboxes, and whether the exec helper is in it
    (rootfs.bwrap_system_args, built once per process; sandbox/forked.py starts its zygote with them too)."""
    return _bwrap_system_args_of(tmp_root, tmp_bytes, os.getpid())


@functools.lru_cache(maxsize=16)
def _bwrap_system_args_of(tmp_root: str, tmp_bytes: int, pid: int) -> tuple[tuple[str, ...], bool]:
    """Per process (`pid`): a forked child must not use its parent's prepared root."""
    return bwrap_system_args(shutil.which("bwrap") or "bwrap", tmp_root, tmp_bytes, python_roots()[0])


class BwrapSandbox(_BaseSandbox):
    """One bubblewrap invocation per command over a persistent copy-on-write workspace."""

    kind = "bwrap"
    _wants_info_fd = True
    _limits_in_script = True  # False once the exec helper sets them

    def __init__(self, base: Path, limits: SandboxLimits, tmp_root: str | None = None,
                 python_env: str | Path | None = None, *, netns_fd: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(base, limits, tmp_root, python_env, netns_fd=netns_fd, env=env)
        self.inner_workspace = BWRAP_WORKSPACE
        if self.python_env is not None:
            self.inner_python_env = BWRAP_PYTHON_ENV
        # As root, one network namespace lent for the sandbox's life (`netns.py`) instead of a new one per
        # command (--unshare-net), which costs ~20 % of a bwrap start; or the task's own (its services).
        self._netns: int | None = netns_fd if netns_fd is not None else (
            netns.POOL.acquire() if netns.available() else None)
        try:
            self._prefix = self._build_prefix(tmp_root)
        except BaseException:  # hand back the workspace, uid and namespace taken so far
            self.close()
            raise

    def _build_prefix(self, tmp_root: str | None) -> list[str]:
        system, helper = bwrap_view_args(tmp_root or default_tmp_root(), self.limits.file_size_mb * 1024 * 1024 * 4)
        if self._netns is not None:
            system = tuple(a for a in system if a != "--unshare-net")
        env = [] if self.python_env is None else ["--ro-bind", self.python_env, BWRAP_PYTHON_ENV]
        a = [*system, *env, "--bind", str(self.workspace), BWRAP_WORKSPACE, "--chdir", BWRAP_WORKSPACE, "--"]
        if helper and self.uid is not None:
            lim = self.limits  # limits, uid and no_new_privs set by one small helper (see rootfs.py)
            self._limits_in_script = False
            return a + [EXEC_PATH, str(self.uid), str(lim.cpu_time_s), str(lim.memory_mb * 1024 * 1024),
                        str(lim.max_procs), str(lim.file_size_mb * 1024 * 1024), "/bin/bash", "bash", "-c"]
        return a + self._setpriv() + ["bash", "-c"]

    def _script(self, command: str) -> str:
        return super()._script(command) if self._limits_in_script else command

    def _argv(self, script: str, info_fd: int, path: str) -> list[str]:
        i = self._prefix.index("--")
        argv = [*self._prefix[:i], "--info-fd", str(info_fd), *self._prefix[i:], script]
        # A command of plain words is exec'd without bash (`direct_exec.py`), when the helper already set
        # the limits and PATH is the default one, whose directories lie at the same paths inside.
        direct = None if self._limits_in_script or path != default_path() else direct_argv(script, path.split(":"))
        return argv if direct is None else argv[:-4] + direct

    def _kill_leftovers(self) -> None:
        """Nothing outlives a command: its pid namespace died with it (in-flight ones were killed)."""

    def _spawning(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self._netns is None else netns.entered(self._netns)

    def _released(self) -> None:
        super()._released()
        if self._netns is not None and self._netns != self._given_netns:
            netns.POOL.release(self._netns)
        self._netns = None

    def _after_timeout(self, info_r: int) -> None:
        # Killing bwrap SIGKILLs the namespace's pid 1 (--die-with-parent); the kernel then kills every
        # process in the namespace, asynchronously. Wait until pid 1 is gone or a zombie: by then
        # the namespace is empty.
        os.set_blocking(info_r, False)
        try:
            info = json.loads(os.read(info_r, 4096).decode() or "{}")
        except (OSError, ValueError):
            return  # bwrap died before it started the namespace
        pid = info.get("child-pid")
        deadline, pause = time.monotonic() + 2.0, 0.0002
        while isinstance(pid, int) and time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return
            if state in ("Z", "X"):
                return
            time.sleep(pause)  # most are gone within a millisecond: look again soon, then less often
            pause = min(2 * pause, 0.002)

    def _cwd(self) -> str:
        return str(self._ws.root)  # bwrap itself runs outside; --chdir puts the command in /workspace

    def _run_env(self, env: dict[str, str] | None) -> dict[str, str]:
        return self._env(env, home=BWRAP_WORKSPACE, tmp="/tmp")


class LocalSandbox(_BaseSandbox):
    """A subprocess in the private workspace; as root: no network and a per-sandbox uid."""

    kind = "local"
    _lifeline = True  # no pid namespace to die with the owner: the lifeline kills its commands and uid

    def __init__(self, base: Path, limits: SandboxLimits, tmp_root: str | None = None,
                 python_env: str | Path | None = None, *, netns_fd: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(base, limits, tmp_root, python_env, netns_fd=netns_fd, env=env)
        self._tmp = self._ws.scratch("tmp", owner_uid=self.uid)
        if self.uid is None:
            self._prefix = ["bash", "-c"]
            return
        fstab = python_view_fstab()
        # no network: a new namespace per command, or the task's own one entered at spawn (`_spawning`)
        net = [] if netns_fd is not None else ["--net"]
        if fstab is None:
            self._prefix = (["unshare", *net] if net else []) + [*self._setpriv(), "bash", "-c"]
        else:  # a private mount namespace that shows the interpreter to the sandbox uid
            setpriv = " ".join(self._setpriv())
            self._prefix = ["unshare", *net, "--mount", "--propagation", "private", "bash", "-c",
                            f"mount -a -T {fstab} || exit 126\nexec {setpriv} bash -c \"$1\"", "sandbox-setup"]

    def _argv(self, script: str, info_fd: int, path: str) -> list[str]:
        return [*self._prefix, script]

    def _spawning(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self._given_netns is None else netns.entered(self._given_netns)

    def _run_env(self, env: dict[str, str] | None) -> dict[str, str]:
        return self._env(env, home=str(self.workspace), tmp=str(self._tmp))

    def _after_timeout(self, info_r: int) -> None:
        if self.uid is not None:
            kill_uid(self.uid)  # daemons that escaped the process group with setsid


def create_sandbox(base: Path, limits: SandboxLimits | None = None, kind: str = "auto",
                   tmp_root: str | None = None, python_env: str | Path | None = None, *,
                   netns_fd: int | None = None, env: dict[str, str] | None = None) -> BwrapSandbox | LocalSandbox:
    """A sandbox whose workspace is a copy-on-write view of `base` (see `materialize_base`).

    `python_env`: a task's own virtual environment (tasks/repoenv.py), bound read-only (bwrap: at /env; local:
    at its host path, which the sandbox uid must be able to read) and first on PATH, so `python` is its Python.
    `netns_fd`: run its commands in this network namespace (a task's services, `services.py`; the caller keeps
    it) instead of one of their own; `env`: variables every command gets (under those of the call)."""
    resolved = resolve_kind(kind)
    limits = SandboxLimits() if limits is None else limits
    cls = BwrapSandbox if resolved == "bwrap" else LocalSandbox
    return cls(Path(base), limits, tmp_root=tmp_root, python_env=python_env, netns_fd=netns_fd, env=env)


def describe_host(tmp_root: str | None = None) -> dict[str, object]:
    """What this host gives sandboxes: for benchmarks and `flywheel` diagnostics."""
    tmp = tmp_root or default_tmp_root()
    out: dict[str, object] = {"bwrap": bwrap_available(), "auto_kind": resolve_kind("auto"),
                              "workspace_mode": workspace_mode(tmp_root), "root": is_root(),
                              "bwrap_path": shutil.which("bwrap"), "stale_dirs_reaped": _reap_once(tmp)}
    if out["bwrap"]:
        system, helper = bwrap_view_args(tmp, 1 << 20)
        out["bwrap_prepared_root"] = any(a.startswith(os.path.join(tmp, "flywheel-root-")) for a in system)
        out["bwrap_exec_helper"] = helper
    return out
