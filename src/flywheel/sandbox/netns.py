"""Network namespaces made once and lent one per sandbox, instead of a fresh one per command.

A bwrap sandbox must see no network: only a loopback of its own. ``bwrap --unshare-net`` gives each
command a new network namespace, and the kernel tears it down after the command (``cleanup_net``);
on this 2-core machine that is ~20 % of a bwrap start (a burst of our bwrap command lines: 193/s with
``--unshare-net``, 228/s without, medians of 5 in one run). As root this pool pays that once per
slot instead:

* `NetnsPool.acquire()` lends a namespace holding only ``lo`` (up, 127.0.0.1) — made on a throwaway
  thread (`unshare(CLONE_NEWNET)` changes only the calling thread) and kept alive by an fd;
* a sandbox starts its commands inside `entered(ns)`: the *calling thread* `setns()`s into the
  namespace, `subprocess.Popen` forks from that thread (the child inherits the thread's namespace)
  and the thread switches back, so no other thread of the process ever leaves the host namespace;
* `release(ns)` when the sandbox is closed. By then every process of the sandbox is dead (each
  command's pid namespace dies with it), so every socket it opened is closed; the commands ran
  without capabilities, so no route, address, firewall rule or sysctl of the namespace can have
  changed. What can be left is a TCP socket in TIME_WAIT (gone within a minute; a server that binds
  without SO_REUSEADDR may see EADDRINUSE on that port) — the price of reuse, written down here.

Not root, or a kernel that refuses: `available()` is False and sandboxes keep ``--unshare-net``.
Within one sandbox all commands share its namespace, as they would share one machine's loopback.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import socket
import struct
import threading
from collections.abc import Iterator

from flywheel.sandbox.workspace import libc

__all__ = ["POOL", "NetnsPool", "available", "entered", "fresh", "held_by_this_process"]

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the union (40 bytes)
MAX_IDLE = 64  # namespaces kept for reuse; beyond that a released one is closed


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _make() -> int:
    """A new network namespace with its loopback up; returns an fd that keeps it alive."""
    out: list[int | BaseException] = []

    def body() -> None:  # on a thread of its own: unshare() moves only this thread, which then ends
        try:
            _check(libc().unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
                fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))
            out.append(os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            out.append(err)

    t = threading.Thread(target=body, name="flywheel-netns", daemon=True)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


class NetnsPool:
    """Namespaces free for lending (fds), per process: a forked child starts with an empty pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[int] = []
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:  # the child's copies of the fds are closed by exec, or stay unused
        self._lock = threading.Lock()
        self._free = []

    def acquire(self) -> int:
        with self._lock:
            if self._free:
                return self._free.pop()
        return _make()

    def release(self, ns: int) -> None:
        with self._lock:
            if len(self._free) < MAX_IDLE:
                self._free.append(ns)
                return
        os.close(ns)


POOL = NetnsPool()


def fresh() -> int:
    """A new namespace (loopback up) that is never lent again: the caller closes its fd when done."""
    return _make()


@contextlib.contextmanager
def entered(ns: int) -> Iterator[None]:
    """Run the body with the calling thread in namespace `ns` (processes it starts are born there)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc().setns(ns, _CLONE_NEWNET), "setns(sandbox netns)")
        try:
            yield
        finally:
            # Failing to return would leave this thread (a pool worker, say) without the host network.
            _check(libc().setns(home, _CLONE_NEWNET), "setns(back to the host netns)")
    finally:
        os.close(home)


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether this process may make and enter network namespaces (root, and a kernel that lets it)."""
    if os.geteuid() != 0:
        return False
    try:
        ns = _make()
        with entered(ns):
            pass
    except OSError:
        return False
    POOL.release(ns)
    return True


def held_by_this_process() -> int:
    """How many network namespaces this process holds open by fd (the pool's, lent or idle, and fresh ones not yet
    closed): a check that every namespace a run made for its services was closed again."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}").startswith("net:[")
        except OSError:  # the fd listdir itself used, closed by now
            pass
    return held
