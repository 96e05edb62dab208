"""The grading zygote: pytest imported once, then every run forked from it into namespaces and a uid of its own.

    python -c "$(cat zygote_main.py)" < job.json      # what sandbox/forked.py starts inside one bwrap sandbox

Why: a repository's graded tests run several times per grading (the real run and its twins, envs/suite.py), each
in a fresh interpreter. About 190 of each run's ~220 ms here went into importing pytest. Forking from a process
that already imported it gives each run a fresh interpreter state (its own copy of every module, nothing shared
back) at the cost of a fork.

What each run gets, so that no run can see or reach another (the twin argument needs the runs independent):
* a mount namespace in which its own workspace is at /workspace, every other run's workspace is unmounted, and
  /tmp is a fresh tmpfs (/dev/shm points there);
* its own network (only a loopback, up), IPC and UTS namespaces, and a pid namespace whose pid 1 is a trusted
  stub of this program: when the run's process exits, the kernel kills whatever it left behind;
* its own uid (setresuid from root: no capabilities left), no_new_privs, and the limits (soft = hard) the sandbox's
  exec helper sets (sandbox/rootfs.py);
* stdin, stdout and stderr on /dev/null (the verdict reads the run's report file and its exit status only) and no
  other descriptor of the zygote's.

What the zygote holds when it forks, and so what every run can read in its own memory: pytest's modules and the
job (each run's workspace path, uid and arguments). The job carries nothing that tells runs apart but their
random order: which run is a twin is not in it (forked.py shuffles the runs; the arguments of a run and its twins
are the same). This file is run by the task's own interpreter (its Python environment), so it imports only the
standard library and pytest. The zygote itself runs as root with CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID and
CAP_NET_ADMIN inside its sandbox, and never runs code of the workspace: the workspaces are not on its path, and
its working directory is /.

Protocol: stdin is one JSON object {"runs": [{"dir", "uid", "argv", "script"}], "env", "limits", "timeout_s",
"parallel", "tmp_bytes", "keep"}; stdout gets one line per finished run, {"run": i, "status": exit status or -signal,
"timed_out": bool}, then {"done": true}. A run that could not be set up exits 125 with its reason on the
zygote's stderr.
Tests: tests/unit/test_forked.py.
"""

import atexit
import ctypes
import fcntl
import gc
import importlib
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x4000000, 0x8000000, 0x20000000, \
    0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1
SIOCSIFFLAGS, IFF_UP, IFF_RUNNING = 0x8914, 0x1, 0x40
LIMITS = (("cpu", resource.RLIMIT_CPU), ("as", resource.RLIMIT_AS), ("nproc", resource.RLIMIT_NPROC),
          ("fsize", resource.RLIMIT_FSIZE))
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    _check(_libc.mount(None if src is None else src.encode(), target.encode(),
                       None if fstype is None else fstype.encode(), ctypes.c_ulong(flags),
                       None if data is None else data.encode()), f"mount {src} on {target}")


def _isolate(run, others, tmp_bytes, keep):
    """In the forked child, as root: new namespaces, this run's workspace at /workspace, nothing of the others.
    `keep`: directories under /tmp that the fresh /tmp must still show, read-only (the interpreter's own tree
    when it lives there, e.g. a CI checkout in /tmp)."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(run["dir"], "/workspace", None, MS_BIND | MS_REC)
    for d in others:  # every workspace, this run's too: what stays is the bind at /workspace
        _check(_libc.umount2(d.encode(), MNT_DETACH), f"umount {d}")
    kept = [(d, os.open(d, os.O_PATH | os.O_DIRECTORY)) for d in keep]  # reachable after the tmpfs covers them
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={tmp_bytes}")
    for d, fd in kept:
        os.makedirs(d, mode=0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", d, None, MS_BIND | MS_REC)
        _mount(None, d, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    _check(_libc.sethostname(b"sandbox", 7), "sethostname")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # the loopback of the new network namespace
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_RUNNING))


def _become(run, job):
    """In the run's process (pid 2 of its namespace): limits, the run's uid, no capabilities, no_new_privs."""
    os.chdir("/workspace")
    for key, res in LIMITS:
        resource.setrlimit(res, (job["limits"][key], job["limits"][key]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    uid = run["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to a non-zero uid: every capability is cleared
    if os.getresuid() != (uid, uid, uid):
        raise OSError("the uid did not take")
    with open("/proc/self/status") as fh:
        if any(line.startswith("CapEff:") and int(line.split()[1], 16) for line in fh):
            raise OSError("capabilities left after setresuid")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _stdio_to_null():
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 65536)


def _run_pytest(run, job):
    """The run itself, in this already-initialised interpreter: what `pytest ARGS` / `python -m pytest ARGS` does."""
    import pytest
    os.environ.clear()
    os.environ.update(job["env"])
    if run["script"] == "module":  # `python -m pytest`: the working directory first on the path
        sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *run["argv"]]
        sys.path.insert(0, os.getcwd())
    else:  # the console script: its directory first, as for any script
        sys.argv = [run["script"], *run["argv"]]
        sys.path.insert(0, os.path.dirname(run["script"]))
    code: object
    try:
        code = pytest.console_main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - as the interpreter does: the traceback, then status 1
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    _finalize(0 if code is None else int(code))


def _finalize(code):
    """What the interpreter does at exit, then the exit: wait for non-daemon threads, run the atexit handlers,
    flush. (Raising SystemExit here would unwind through the zygote's own frames instead.)"""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001, S110
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110
            pass
    os._exit(code & 0xFF)


def _code(wait_status):
    """An exit status as a shell reports it: the code, or 128 + the signal that killed the process."""
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


def _init(run, job):
    """pid 1 of the run's pid namespace: start the run, wait for it, exit with its status. When this process
    exits (or its parent dies: the death signal), the kernel kills everything left in the namespace."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this namespace's processes only
    pid = os.fork()
    if pid == 0:
        try:
            _become(run, job)
            _stdio_to_null()
        except BaseException as exc:  # noqa: BLE001 - reported; the run then counts as failed
            os.write(2, f"zygote: run {run['dir']} not set up: {exc}\n".encode())
            os._exit(125)
        _run_pytest(run, job)  # never returns: it leaves as the interpreter would (threads joined, atexit run)
    _stdio_to_null()
    while True:  # reap every orphan; the run's own status is the one that counts
        got, st = os.waitpid(-1, 0)
        if got == pid:
            os._exit(_code(st))


def _child(run, job, others):
    """The forked child: new namespaces, then the parent of their pid 1. Never returns."""
    code = 125
    try:
        _isolate(run, others, job["tmp_bytes"], job.get("keep", []))
        init = os.fork()
        if init == 0:
            try:
                _init(run, job)
            except BaseException as exc:  # noqa: BLE001
                os.write(2, f"zygote: run {run['dir']} not set up: {exc}\n".encode())
            os._exit(125)
        _, st = os.waitpid(init, 0)
        code = _code(st)
    except BaseException as exc:  # noqa: BLE001
        os.write(2, f"zygote: run {run['dir']} not set up: {exc}\n".encode())
    os._exit(code)


def main():
    job = json.loads(sys.stdin.read())
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    import _pytest.config  # the runner and its built-in plugins, once for every run
    import pytest  # noqa: F401
    for name in _pytest.config.default_plugins:
        importlib.import_module(f"_pytest.{name}")
    gc.freeze()  # what was imported stays out of every run's collections: fewer pages copied, shorter gc passes
    runs, others = job["runs"], [r["dir"] for r in job["runs"]]
    pending, live = list(range(len(runs))), {}  # type: ignore[var-annotated]  # live: pidfd -> (run index, pid, deadline)
    out = sys.stdout
    while pending or live:
        while pending and len(live) < max(1, job["parallel"]):
            i = pending.pop(0)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(runs[i], job, others)
            live[os.pidfd_open(pid)] = (i, pid, time.monotonic() + job["timeout_s"])
        now = time.monotonic()
        ready, _, _ = select.select(list(live), [], [], max(0.0, min(d for _, _, d in live.values()) - now))
        for fd in list(live):
            i, pid, deadline = live[fd]
            timed_out = fd not in ready and time.monotonic() >= deadline
            if fd not in ready and not timed_out:
                continue
            if timed_out:
                os.kill(pid, signal.SIGKILL)
            _, st = os.waitpid(pid, 0)
            os.close(fd)
            del live[fd]
            out.write(json.dumps({"run": i, "status": _code(st), "timed_out": timed_out}) + "\n")
            out.flush()
    out.write(json.dumps({"done": True}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
