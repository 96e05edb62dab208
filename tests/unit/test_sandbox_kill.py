"""Nothing of a sandbox outlives its owner: a process SIGKILLed while its sandbox runs commands (daemons among
them) leaves no process behind, and the next process's reaper removes its workspace (`rootfs.reap_stale`)."""

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
