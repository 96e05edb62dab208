"""A lifeline: what this process started dies with it, even when it is SIGKILLed.

    LIFELINE.track_group(proc.pid)      # a command started with start_new_session=True
    ...; LIFELINE.untrack_group(proc.pid)
    LIFELINE.track_uid(uid)             # every process of a sandbox's own uid (as root)

Why: a command started in a process group of its own (so a timeout can kill it and all its children at once)
is no longer in its owner's process group, so nothing kills it when the owner dies without cleaning up
(SIGKILL, the OOM killer, a crash in C). `PR_SET_PDEATHSIG` reaches only the direct child (and is cleared when
`setpriv` changes the uid), not a pytest's workers or a shell's pipeline. The lifeline is one small helper per
process (a `bash` loop, started at the first `track_*`, ~2 MB): it reads a pipe whose write end only this process
holds, keeps the set of process groups and uids registered on it, and when the pipe closes — the owner exited, by
any means — SIGKILLs every group still registered and every process of every uid still registered, then exits.
Registering is one `write` of a few bytes. A forked child closes its inherited copy of the write end (it would
keep the pipe open after the owner's death) and starts its own lifeline when it needs one.

Does not cover: a process that left its group with `setsid` when the owner is not root (no uid of its own to
kill by), and the window of microseconds between a command's start and its registration.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import threading

__all__ = ["LIFELINE", "Lifeline", "register_child"]

# Reads "+g PGID", "-g PGID", "+u UID", "-u UID" lines until EOF, then kills what is still registered.
_SCRIPT = r"""
declare -A groups uids
while read -r op id; do
  case "$op" in
    +g) groups[$id]=1 ;;
    -g) unset "groups[$id]" ;;
    +u) uids[$id]=1 ;;
    -u) unset "uids[$id]" ;;
  esac
done
for id in "${!groups[@]}"; do kill -KILL -- "-$id" 2>/dev/null; done
for id in "${!uids[@]}"; do
  for _ in 1 2 3 4 5 6 7 8 9 10; do pkill -KILL -U "$id" || break; sleep 0.01; done
done
"""


class Lifeline:
    """The lifeline of this process (use the module's `LIFELINE`); thread-safe, fork-aware."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1  # the write end of the pipe (only this process holds it)
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        os.register_at_fork(after_in_child=self._after_fork)
        atexit.register(self.close)

    @property
    def pid(self) -> int | None:
        """The helper's pid (None: not started in this process)."""
        return self._proc.pid if self._proc is not None and self._owner == os.getpid() else None

    def ensure(self) -> None:
        """Start the helper now if it is not running: called before a command starts, so that registering it
        right after is one `write` (starting bash takes milliseconds, more under load, and a command may act and
        its owner die within that)."""
        with self._lock:
            if self._fd < 0 or self._proc is None or self._proc.poll() is not None:
                self._close_locked()
                self._start()

    def child_fd(self) -> int:
        """A copy of the pipe's write end for a child to register its own process group before it execs
        (`register_child`), so that no window is left between the command's start and its registration. The
        caller closes it after the child has started."""
        self.ensure()
        with self._lock:
            return os.dup(self._fd)

    def track_group(self, pgid: int) -> None:
        self._send("+g", pgid)

    def untrack_group(self, pgid: int) -> None:
        self._send("-g", pgid, start=False)

    def track_uid(self, uid: int) -> None:
        self._send("+u", uid)

    def untrack_uid(self, uid: int) -> None:
        self._send("-u", uid, start=False)

    def _after_fork(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._lock = threading.Lock()  # a thread of the parent may have held it
        self._fd, self._proc, self._owner = -1, None, os.getpid()

    def _start(self) -> None:
        r, w = os.pipe()  # both non-inheritable: the helper gets `r` as its stdin only
        try:
            self._proc = subprocess.Popen(["bash", "-c", _SCRIPT], stdin=r, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._fd = w

    def _send(self, op: str, ident: int, *, start: bool = True) -> None:
        if not isinstance(ident, int) or isinstance(ident, bool) or ident <= 0:
            raise ValueError(f"a lifeline tracks positive process-group ids and uids (got {ident!r})")
        line = f"{op} {ident}\n".encode()
        with self._lock:
            for _ in range(2):  # a helper that died (killed by someone) is replaced once
                if self._fd < 0 or self._proc is None or self._proc.poll() is not None:
                    if not start:
                        return  # nothing registered with a helper that is gone
                    self._close_locked()
                    self._start()
                try:
                    os.write(self._fd, line)
                    return
                except OSError:
                    self._close_locked()

    def _close_locked(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                self._proc.wait(timeout=5)  # it exits at EOF, after killing what was left registered
        self._proc = None

    def close(self) -> None:
        """Close the pipe (what is still registered is killed) and reap the helper; at exit, or in tests."""
        if self._owner != os.getpid():
            return
        with self._lock:
            self._close_locked()


def register_child(fd: int) -> None:
    """In a child between fork and exec, leader of its own process group: register that group on `fd`
    (`Lifeline.child_fd`). A failed write leaves the owner's own registration after the start."""
    try:
        os.write(fd, f"+g {os.getpid()}\n".encode())
    except OSError:
        pass


LIFELINE = Lifeline()
