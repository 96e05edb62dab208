"""Lent network namespaces (`sandbox/netns.py`): loopback inside, isolation between sandboxes, reuse, and
the calling thread always back in the host namespace."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from flywheel.sandbox import netns
from flywheel.sandbox.sandbox import SandboxLimits, bwrap_available, create_sandbox, flush_closed, materialize_base

pytestmark = pytest.mark.skipif(not netns.available(), reason="needs root and network namespaces")

SERVER = ("import socket, sys, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('127.0.0.1', 47123)); s.listen(4); s.settimeout({t})\nprint('LISTENING', flush=True)\n"
          "try:\n    c, _ = s.accept(); print('ACCEPTED', flush=True)\nexcept OSError:\n    print('NOBODY')\n")
CLIENT = ("import socket, time\nend = time.time() + {t}\nwhile True:\n    try:\n"
          "        socket.create_connection(('127.0.0.1', 47123), timeout=1); print('CONNECTED'); break\n"
          "    except OSError as e:\n        if time.time() > end:\n            print('BLOCKED', e.errno); break\n"
          "        time.sleep(0.1)\n")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return materialize_base({"a.txt": "a\n"}, tmp_path_factory.mktemp("netns") / "base")


def _host_ns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def test_entered_moves_only_the_calling_thread_and_back() -> None:
    host = _host_ns()
    ns = netns.POOL.acquire()
    seen: list[int] = []
    go = threading.Event()
    t = threading.Thread(target=lambda: (go.wait(10), seen.append(_host_ns())))  # a thread that already runs
    t.start()
    try:
        with netns.entered(ns):
            inside = _host_ns()
            go.set()
            t.join()
        assert inside != host and seen == [host]  # the other thread stayed in the host namespace
        assert _host_ns() == host
    finally:
        netns.POOL.release(ns)


def test_pool_reuses_released_namespaces() -> None:
    a = netns.POOL.acquire()
    with netns.entered(a):
        ino = _host_ns()
    netns.POOL.release(a)
    b = netns.POOL.acquire()
    try:
        with netns.entered(b):
            assert _host_ns() == ino
    finally:
        netns.POOL.release(b)


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not usable")
def test_loopback_inside_and_isolation_between_sandboxes(base: Path) -> None:
    with create_sandbox(base, SandboxLimits(timeout_s=20), "bwrap") as a, \
            create_sandbox(base, SandboxLimits(timeout_s=20), "bwrap") as b:
        # one command: a server and a client on the sandbox's own loopback
        r = a.run(f"python -c \"{SERVER.format(t=10)}\" & python -c \"{CLIENT.format(t=8)}\"; wait")
        assert "CONNECTED" in r.stdout, r.output  # a TCP connect succeeds only with a listener on this loopback
        # a server in sandbox a is not reachable from sandbox b, at the same moment
        out: dict[str, str] = {}
        t = threading.Thread(target=lambda: out.update(a=a.run(f"python -c \"{SERVER.format(t=5)}\"").stdout))
        t.start()
        time.sleep(0.5)
        out["b"] = b.run(f"python -c \"{CLIENT.format(t=3)}\"").stdout  # keeps trying for 3 s
        t.join()
        assert "LISTENING" in out["a"] and "NOBODY" in out["a"], out
        assert "BLOCKED" in out["b"], out
    flush_closed()


@pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not usable")
def test_a_sandbox_that_fails_to_start_hands_back_its_namespace(base: Path, monkeypatch) -> None:
    from flywheel.sandbox.sandbox import BwrapSandbox

    a = netns.POOL.acquire()
    netns.POOL.release(a)  # now the next acquire lends `a`

    def broken(self, tmp_root):
        raise OSError("no bwrap arguments today")

    monkeypatch.setattr(BwrapSandbox, "_build_prefix", broken)
    with pytest.raises(OSError, match="no bwrap arguments") as failed:
        create_sandbox(base, SandboxLimits(), kind="bwrap")
    assert flush_closed(timeout_s=10)
    # `failed` keeps the traceback, and with it the half-built sandbox, alive: `a` must be back all the same
    # (not only once the garbage collector runs the sandbox's __del__)
    b = netns.POOL.acquire()
    netns.POOL.release(b)
    assert b == a and failed.value is not None
