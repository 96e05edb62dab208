"""Forked grading runs (sandbox/forked.py, zygote_main.py): each run sees its own tree and nothing of the others'
(workspace, /tmp, processes, network, uid), keeps no capability, and leaves nothing running; results come back in
the caller's order with their exit status; a run past its time is killed."""

import json
import os
import time
from pathlib import Path

import pytest

from flywheel.sandbox.contract import SandboxLimits
from flywheel.sandbox.forked import ForkedRun, forked_available, run_forked
from flywheel.sandbox.host import bwrap_available, is_root, python_roots

pytestmark = pytest.mark.skipif(not (is_root() and bwrap_available()), reason="forked runs need bwrap as root")


def test_available_where_bwrap_runs_as_root():
    assert forked_available("auto") and not forked_available("local")

PROBE = '''import json, os, socket, subprocess, sys


def test_probe():
    tag = open("tag.txt").read()
    seen = {
        "tag": tag,
        "uid": os.getuid(),
        "cwd": os.getcwd(),
        "cap_eff": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0],
        "tmp": sorted(os.listdir("/tmp")),
        "runs_dir": os.path.exists("/tmp/.runs"),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "mounts": [l.split()[4] for l in open("/proc/self/mountinfo")],
        "argv0": sys.argv[0],
        "path0": sys.path[0],
        "prefix_writable": os.access(sys.prefix, os.W_OK),
    }
    open(f"/tmp/mark-{tag}", "w").write(tag)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # the loopback is up
    s.close()
    if "daemon" in tag:  # a process left behind: its namespace must die with the run
        subprocess.Popen(["sleep", "60"], start_new_session=True)
    open("seen.json", "w").write(json.dumps(seen))
    assert "fail" not in tag
'''


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "tag.txt").write_text("base")
    return tmp_path


def _interpreter_in_tmp() -> list[str]:
    """The top directories of /tmp that hold the interpreter's tree (a checkout under /tmp): kept, read-only."""
    return sorted({Path(r).parts[2] for r in python_roots()[0] if r.startswith("/tmp/")})


def _runs(*tags: str) -> list[ForkedRun]:
    return [ForkedRun({"tag.txt": t}, ["-q", "-p", "no:cacheprovider", "test_probe.py"], "seen.json") for t in tags]


def test_each_run_sees_only_its_own_tree(base):
    results = run_forked(base, _runs("a", "b", "c-fail"), limits=SandboxLimits(), script="module", timeout_s=60,
                         parallel=2)
    seen = [json.loads(r.text) for r in results]
    assert [s["tag"] for s in seen] == ["a", "b", "c-fail"]  # the caller's order, whatever order they ran in
    assert [r.returncode for r in results] == [0, 0, 1] and not any(r.timed_out for r in results)
    assert len({s["uid"] for s in seen}) == 3 and all(s["uid"] >= 1_000_000_000 for s in seen)
    for s in seen:
        assert s["cap_eff"] == "0000000000000000" and s["cwd"] == "/workspace"
        # a fresh /tmp (holding only the interpreter's own tree where it lives there); no other run's mark, no
        # other workspace
        assert s["tmp"] == _interpreter_in_tmp() and not s["runs_dir"] and not s["prefix_writable"]
        assert not any(m.startswith("/tmp/.runs") for m in s["mounts"])
        assert max(s["pids"]) < 10  # its own pid namespace: the stub, the run, whatever the run started
        assert s["path0"] == "/workspace" and s["argv0"].endswith("pytest/__main__.py")


def test_nothing_outlives_its_run(base):
    t0 = time.monotonic()
    results = run_forked(base, _runs("daemon"), limits=SandboxLimits(), script="console", timeout_s=60, parallel=1)
    uid = json.loads(results[0].text)["uid"]
    assert results[0].returncode == 0 and json.loads(results[0].text)["argv0"].endswith("/pytest")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid]
        if not left:
            break
        time.sleep(0.05)
    assert not left and time.monotonic() - t0 < 30


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_a_run_past_its_time_is_killed(tmp_path):
    (tmp_path / "test_slow.py").write_text("import time\n\n\ndef test_slow():\n    time.sleep(60)\n")
    t0 = time.monotonic()
    [r] = run_forked(tmp_path, [ForkedRun({}, ["-q", "test_slow.py"], "none")], limits=SandboxLimits(),
                     script="module", timeout_s=2, parallel=1)
    assert r.timed_out and r.text is None and time.monotonic() - t0 < 20


def test_runs_must_write_the_same_paths(base):
    runs = [ForkedRun({"tag.txt": "a"}, ["-q"], "x"), ForkedRun({"tag.txt": "b", "other.txt": "c"}, ["-q"], "x")]
    with pytest.raises(ValueError, match="same paths"):
        run_forked(base, runs, limits=SandboxLimits(), script="module", timeout_s=10, parallel=1)
