"""Nothing of a sandbox outlives its owner: a process SIGKILLed while its sandbox runs commands (daemons among
them) leaves no process behind, and the next process's reaper removes its workspace (`rootfs.reap_stale`).
bwrap: its --die-with-parent and pid namespace; local: the owner's lifeline (`sandbox/lifeline.py`).

    pytest tests/unit/test_sandbox_kill.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flywheel.sandbox.host import bwrap_available, is_root
from flywheel.sandbox.rootfs import reap_stale

OWNER = textwrap.dedent("""
    import sys
    from flywheel.sandbox.sandbox import create_sandbox, materialize_base
    base = materialize_base({"a.txt": "a"}, sys.argv[1])
    sb = create_sandbox(base, kind="bwrap")
    print(sb.uid, sb._ws.root, flush=True)
    # a daemon that leaves the process group, and a foreground command that never ends
    sb.run("setsid sleep 300 >/dev/null 2>&1 < /dev/null & sleep 300", timeout_s=600)
""")


def _procs_of(uid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.mark.skipif(not (is_root() and bwrap_available()), reason="needs root and bubblewrap")
def test_sigkill_of_the_owner_leaves_no_sandbox_process_and_its_workspace_is_reaped(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "base")], stdout=subprocess.PIPE, text=True)
    try:
        uid_s, root_s = proc.stdout.readline().split()  # type: ignore[union-attr]
        uid, root = int(uid_s), Path(root_s)
        deadline = time.monotonic() + 20
        while len(_procs_of(uid)) < 2 and time.monotonic() < deadline:  # both sleeps are up
            time.sleep(0.02)
        assert len(_procs_of(uid)) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while _procs_of(uid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _procs_of(uid) == []  # bwrap died with its parent, and the pid namespace with it
        assert root.exists()  # the dead owner could not clean up: the reaper does
        assert reap_stale(str(root.parent)) >= 1
        assert not root.exists() and str(root) not in Path("/proc/mounts").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


LOCAL_OWNER = textwrap.dedent("""
    import sys
    from flywheel.sandbox.sandbox import create_sandbox, materialize_base
    base = materialize_base({"a.txt": "a"}, sys.argv[1])
    sb = create_sandbox(base, kind="local")
    print(sb.workspace, flush=True)
    # a grandchild in the background, and a foreground command that never ends; both write their pid
    sb.run("sleep 300 & echo $! $$ > pids.txt; sleep 300", timeout_s=600)
""")


def _gone(pid: int) -> bool:
    """No such process, or a zombie waiting for init (it has stopped running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_sigkill_of_the_owner_kills_the_commands_of_a_local_sandbox(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", LOCAL_OWNER, str(tmp_path / "base")], stdout=subprocess.PIPE,
                            text=True)
    try:
        pids_file = Path(proc.stdout.readline().strip()) / "pids.txt"  # type: ignore[union-attr]
        deadline = time.monotonic() + 20
        while not (pids_file.exists() and len(pids_file.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        pids = [int(w) for w in pids_file.read_text().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [p for p in pids if not _gone(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
