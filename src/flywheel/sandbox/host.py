"""Host facts a sandbox needs, probed once per process, and the low-level helpers of running a command.

    bwrap_available(), resolve_kind("auto"), default_path(), is_root()
    uid = UIDS.acquire(); ...; kill_uid(uid); UIDS.release(uid)
    fd = memfd("out"); ...; read_capped(fd)

Why a module of its own: these are facts of the machine (is bubblewrap usable, where the interpreter lives,
which uids are free), not of any one sandbox; `sandbox.py` builds the two kinds of sandbox from them.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KINDS = ("auto", "bwrap", "local")
MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # bytes kept per stream (head + tail); the harness truncates further
UID_BASE = 1_000_000_000
UID_SLOTS = 10_000




@functools.lru_cache(maxsize=1)
def bwrap_available() -> bool:
    """bubblewrap is installed and can create the namespaces we use (probed once by running `true`)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
                            "--unshare-pid", "--unshare-ipc", "--die-with-parent", "true"],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def resolve_kind(kind: str) -> str:
    """'auto' -> 'bwrap' where it works, else 'local'; 'bwrap' refused with a fix where it does not."""
    if kind not in KINDS:
        raise ValueError(f"sandbox kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if kind == "auto":
        return "bwrap" if bwrap_available() else "local"
    if kind == "bwrap" and not bwrap_available():
        raise ValueError("sandbox kind 'bwrap' needs a working bubblewrap: install it (`apt-get install "
                         "bubblewrap`) or set env.sandbox = 'local' (or 'auto')")
    return kind


def is_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def python_roots() -> tuple[tuple[str, ...], str]:
    """Host directories holding the running Python (venv + base install) and the venv's bin dir."""
    roots: list[str] = []
    for p in sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
                     os.path.realpath(sys.exec_prefix)}, key=len):
        if p.startswith("/usr/") or p == "/usr" or any(p.startswith(r + "/") for r in roots):
            continue
        roots.append(p)
    # the resolved path: a venv reached through a symlink is bound at its real path, so its bin/ is there
    return tuple(roots), os.path.join(os.path.realpath(sys.prefix), "bin")


def default_path() -> str:
    """The sandboxed command's PATH: the interpreter's bin/ first (its pytest), then the system's."""
    return f"{python_roots()[1]}:/usr/local/bin:/usr/bin:/bin"


class UidPool:
    """Unprivileged uids unique to each live sandbox of this process (and, via the pid, of this host)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: release() may run from a __del__ during acquire()
        self._free: list[int] = []
        self._next = 0
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:  # a thread of the parent may have held the lock; uids embed the pid
        self._lock = threading.RLock()
        self._free, self._next = [], 0

    def acquire(self) -> int:
        with self._lock:
            if self._free:
                slot = self._free.pop()
            else:
                slot = self._next % UID_SLOTS  # beyond 10,000 live sandboxes, slots (budgets) are shared
                self._next += 1
            return UID_BASE + (os.getpid() % 100_000) * UID_SLOTS + slot

    def release(self, uid: int) -> None:
        with self._lock:
            self._free.append((uid - UID_BASE) % UID_SLOTS)


def kill_uid(uid: int, max_rounds: int = 100) -> int:
    """SIGKILL every process whose owner is `uid` until none is left; returns how many were killed."""
    killed = 0
    for _ in range(max_rounds):
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if os.stat(f"/proc/{name}").st_uid == uid:
                        found.append(int(name))
                except OSError:
                    continue
        if not found:
            return killed
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.005)
    return killed


def kill_group(pgid: int) -> None:
    """SIGKILL every process of process group `pgid`; a group already gone (or not ours) is not an error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_capped(fd: int) -> str:
    """What a command wrote to the memfd `fd`: all of it, or its first and last MAX_OUTPUT_BYTES / 2."""
    size = os.fstat(fd).st_size
    if size <= MAX_OUTPUT_BYTES:
        data = os.pread(fd, size, 0) if size else b""
    else:
        half = MAX_OUTPUT_BYTES // 2
        data = (os.pread(fd, half, 0) + f"\n[... {size - 2 * half} bytes cut ...]\n".encode()
                + os.pread(fd, half, size - half))
    return data.decode("utf-8", errors="replace")


def memfd(name: str, text: str | None = None) -> int:
    """An anonymous in-memory file (no path to create or unlink), rewound after `text` is written.

    An output memfd (no `text`) is opened for appending: the processes of one command share its file
    offset, and the kernel does not serialise that offset for memfds, so two processes writing at once
    (a server and a client, `a & b`) wrote at the same offset and one's bytes overwrote the other's.
    With O_APPEND every write lands at the end, whole."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    if text:
        data = text.encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    else:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd


UIDS = UidPool()


def _rmtree_if_owner(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:  # not in a forked child: the directory is its parent's
        shutil.rmtree(path, ignore_errors=True)


def _blocking_ancestor(path: str) -> str | None:
    """The top-most directory on `path` that other users cannot traverse (None: all of it is reachable)."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        anc = str(Path(*parts[:i]))
        if not os.stat(anc).st_mode & 0o001:
            return anc
    return None


@functools.lru_cache(maxsize=1)
def python_view_fstab() -> str | None:
    """An fstab that, mounted in a private mount namespace, lets an unprivileged uid run our Python.

    Where the interpreter lies under a private directory (a pyenv under /root, mode 0700), that
    directory is covered by a world-traversable skeleton holding read-only binds of the Python roots
    only. Built once per process; the mounts exist only inside each command's mount namespace.
    """
    roots, _ = python_roots()
    blocked = [(r, a) for r in roots if (a := _blocking_ancestor(r)) is not None]
    if not blocked:
        return None
    view = Path(tempfile.mkdtemp(prefix="flywheel-pyview-"))
    os.chmod(view, 0o755)
    atexit.register(_rmtree_if_owner, str(view), os.getpid())
    lines, covers = [], []
    for i, anc in enumerate(sorted({a for _, a in blocked})):
        skel = view / f"skel{i}"
        skel.mkdir(mode=0o755)
        for r, a in blocked:
            if a == anc:
                inner = skel / os.path.relpath(r, anc)
                inner.mkdir(parents=True, exist_ok=True)
                for d in [inner, *inner.relative_to(skel).parents]:
                    os.chmod(skel / d, 0o755)
                lines.append(f"{r} {inner} none bind,ro 0 0")
        covers.append(f"{skel} {anc} none rbind 0 0")
    text = "\n".join(lines + covers) + "\n"
    if any(c.isspace() for path in [*roots, str(view)] for c in path):
        return None  # paths with spaces would need fstab escaping; the uid then lacks our Python
    fstab = view / "fstab"
    fstab.write_text(text)
    return str(fstab)
