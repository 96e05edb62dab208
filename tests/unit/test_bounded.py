"""Host commands of mining (sandbox/bounded.py): past the limit, at exit and at the owner's death, the whole process
group dies, and the address-space limit holds. Only processes the test itself starts are looked at (by PID).

    pytest tests/unit/test_bounded.py
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

from flywheel.sandbox.bounded import run_bounded


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for init (it has stopped running)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if not gone(p)]


def read_pids(path: Path, n: int, within_s: float = 10) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        words = path.read_text().split() if path.exists() else []
        if len(words) >= n:
            return [int(w) for w in words]
        time.sleep(0.02)
    raise AssertionError(f"{path} did not get {n} pids")


def test_a_timeout_kills_the_command_and_its_grandchildren(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    r = run_bounded(f"sleep 300 & echo $! $$ > {pids}; sleep 300", timeout_s=1.0)
    assert r.timed_out and r.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 10
    assert wait_gone(read_pids(pids, 2), 5) == []


def test_a_background_grandchild_does_not_outlive_or_stall_the_command(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    r = run_bounded(f"sleep 300 & echo $! > {pids}; echo done", timeout_s=60)
    assert not r.timed_out and r.returncode == 0 and r.stdout.strip() == "done"
    assert time.monotonic() - t0 < 10  # the grandchild holds stdout open: output is a memfd, not a pipe
    assert wait_gone(read_pids(pids, 1), 5) == []


def test_the_address_space_limit_holds_for_the_command() -> None:
    r = run_bounded([sys.executable, "-c", "b = bytearray(1 << 30)"], timeout_s=60, memory_mb=256)
    assert r.returncode != 0 and "MemoryError" in r.stderr
    ok = run_bounded([sys.executable, "-c", "b = bytearray(1 << 20); print(len(b))"], timeout_s=60, memory_mb=256)
    assert ok.returncode == 0 and ok.stdout.strip() == str(1 << 20)


def test_bad_limits_are_refused_with_what_to_change() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a positive"):
        run_bounded("true", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb must be an int"):
        run_bounded("true", timeout_s=1, memory_mb=1)


OWNER = textwrap.dedent("""
    import sys
    from flywheel.sandbox.bounded import run_bounded
    # a grandchild in the background and a foreground command that never ends
    run_bounded(f"sleep 300 & echo $! $$ > {sys.argv[1]}; sleep 300", timeout_s=600)
""")


def test_the_command_dies_with_its_owner_on_sigkill(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(pids)])
    try:
        started = read_pids(pids, 2)
        assert not any(gone(p) for p in started)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        assert wait_gone(started, 5) == []
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
