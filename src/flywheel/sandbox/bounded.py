"""Host commands with a wall-clock limit, an address-space limit, and nothing left behind.

    r = run_bounded(["python", "-m", "pytest", "-q"], timeout_s=60, memory_mb=8192, cwd=root, env=env)
    r.returncode, r.stdout, r.stderr, r.timed_out, r.duration

For the commands flywheel runs on the host outside a sandbox: task mining's test runs of candidate bugs, pip
installs of per-repository environments, git (tasks/mine/, tasks/repoenv.py). Each runs in a process group of its
own (`start_new_session`), and that whole group is SIGKILLed when the command times out, when the caller is
interrupted (KeyboardInterrupt, any exception) and after the command exits (a test's background grandchild);
while it runs it is registered with this process's lifeline (`lifeline.py`), so a SIGKILL of flywheel itself
kills it too, and the direct child also gets PR_SET_PDEATHSIG. `memory_mb` sets RLIMIT_AS (soft = hard) for the
command and everything it starts, so a runaway test suite fails with MemoryError instead of taking the machine.
Output goes to memfds, not pipes: a grandchild that keeps stdout open cannot stall the caller (the same choice as
the sandboxes, `sandbox.py`); each stream keeps at most `host.MAX_OUTPUT_BYTES` (head and tail).

The limits are set by a `preexec_fn` (prctl and setrlimit, no lock taken), which makes Python `fork()` instead
of `vfork()`: fine for mining's few commands a minute; the sandboxes, which start thousands, avoid it (`sandbox.py`).

Why a helper of its own: `subprocess.run(timeout=...)` kills only the direct child; a shell's or pytest's
children lived on (one mining run left an orphaned 9 GB pytest). Every host command of mining goes through here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from flywheel.sandbox.contract import ExecResult
from flywheel.sandbox.host import kill_group, memfd, read_capped
from flywheel.sandbox.lifeline import LIFELINE, register_child

__all__ = ["ExecResult", "run_bounded"]

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _child_setup(memory_bytes: int | None, lifeline_fd: int) -> None:
    """In the child, before exec: its process group on the owner's lifeline, die with the parent, and the
    address-space limit (inherited by its children)."""
    register_child(lifeline_fd)
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def run_bounded(args: str | Sequence[str], *, timeout_s: float, memory_mb: int | None = None,
                cwd: str | Path | None = None, env: dict[str, str] | None = None,
                input_text: str | None = None) -> ExecResult:
    """Run `args` (a list: exec'd; a string: `sh -c`) and return its result; see the module docstring.

    `timed_out` is True when it ran past `timeout_s` (its group was killed; `returncode` is then -9). Raises
    OSError when the program cannot be started, ValueError for a bad limit."""
    if not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds (got {timeout_s!r})")
    if memory_mb is not None and (not isinstance(memory_mb, int) or memory_mb < 16):
        raise ValueError(f"memory_mb must be an int >= 16 (MiB) or None for no limit (got {memory_mb!r})")
    memory_bytes = None if memory_mb is None else memory_mb * 2**20
    argv = ["sh", "-c", args] if isinstance(args, str) else list(args)
    fds = [memfd("stdout"), memfd("stderr")]
    in_fd = subprocess.DEVNULL if input_text is None else memfd("stdin", input_text)
    if input_text is not None:
        fds.append(in_fd)
    t0 = time.perf_counter()
    timed_out = False
    try:
        lifeline_fd = LIFELINE.child_fd()  # the child registers its group before it execs: no window
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=in_fd, stdout=fds[0], stderr=fds[1],
                                    start_new_session=True, close_fds=True,
                                    preexec_fn=lambda: _child_setup(memory_bytes, lifeline_fd))  # noqa: PLW1509
        finally:
            os.close(lifeline_fd)
        LIFELINE.track_group(proc.pid)  # again from here, in case the child's write failed
        try:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:  # timeout, interrupt or a normal exit: nothing of the group outlives the call
            kill_group(proc.pid)
            proc.wait()
            LIFELINE.untrack_group(proc.pid)
        return ExecResult(proc.returncode, read_capped(fds[0]), read_capped(fds[1]), timed_out,
                          time.perf_counter() - t0)
    finally:
        for fd in fds:
            os.close(fd)
