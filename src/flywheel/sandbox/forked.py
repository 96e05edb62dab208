"""Several pytest runs over copies of one tree, forked from one interpreter that imported pytest once.

    from flywheel.sandbox.forked import ForkedRun, forked_available, run_forked
    if forked_available("auto"):
        results = run_forked(base, [ForkedRun(files={}, argv=["-q", "tests"], read=".report.xml"), ...],
                             limits=SandboxLimits(), script="module", timeout_s=60, parallel=2)
        results[0].returncode, results[0].timed_out, results[0].text   # text: the `read` file, or None

Why: the suite verdict (envs/suite.py) runs a repository's tests once for real and once per twin, each in a fresh
interpreter. Here a fresh interpreter costs ~220 ms, ~190 of them importing pytest. One bwrap sandbox starts the
zygote (`zygote_main.py`), which imports pytest and forks every run from there into namespaces of its own (see
that file for what each run gets). The runs stay as independent as separate sandboxes: their own mount, network,
IPC, UTS and pid namespaces, their own uid, their own workspace and /tmp.

Run identity: the runs a caller passes differ in the files written over the base (a twin's file) and nothing else
a run could observe. So that nothing else tells them apart:
* the order in which uids, workspaces and the zygote's job list are assigned is a fresh random permutation
  (`random.SystemRandom`), never the caller's order (the real run first);
* `overwrite` writes each file the same way in every run: every run must name the same paths (a ValueError
  otherwise), written in sorted order, with the base file's owner, mode and times.

Needs: bwrap with the prepared root, as root (`forked_available`); elsewhere the caller runs one sandbox per run.
Cost: one sandbox start and one pytest import per call, then a fork per run.
Tests: tests/unit/test_forked.py.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from flywheel.sandbox.contract import SandboxLimits
from flywheel.sandbox.host import UIDS, default_path, is_root, python_roots, resolve_kind
from flywheel.sandbox.rootfs import under_tmp
from flywheel.sandbox.sandbox import BWRAP_PYTHON_ENV, BWRAP_WORKSPACE, bwrap_view_args
from flywheel.sandbox.workspace import Workspace, close_in_background, default_tmp_root

ZYGOTE_SOURCE = Path(__file__).with_name("zygote_main.py")
CAPS = ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_NET_ADMIN")  # the zygote's, inside its sandbox only
RUNS_DIR = "/tmp/.runs"  # where the zygote sees the workspaces; each run unmounts all of them but its own


@dataclass
class ForkedRun:
    """One run: `files` written over the base first, pytest's `argv`, and the file to read back afterwards."""

    files: dict[str, str]
    argv: list[str]
    read: str


@dataclass
class ForkedResult:
    returncode: int  # as a shell reports it (128 + signal); 125: the run could not be set up
    timed_out: bool
    text: str | None  # the `read` file (None: absent, a link or not a regular file)


def forked_available(kind: str) -> bool:
    """Can `run_forked` run here: bwrap (with its prepared root) as root?"""
    try:
        if resolve_kind(kind) != "bwrap" or not is_root():
            return False
    except ValueError:
        return False
    system, _ = bwrap_view_args(default_tmp_root(), 1 << 20)
    return "--dev-bind" in system


def overwrite(workspace: Path, base: Path, files: dict[str, str]) -> None:
    """Write `files` over a fresh view of `base`, each exactly as every other run of the same grading writes it:
    sorted order, a new file (never through a link of the tree), the base file's owner, mode and times where the
    base has it, and the parent directory's times put back."""
    for rel in sorted(files):
        target = workspace / rel
        like = base / rel
        st = like.stat() if like.is_file() and not like.is_symlink() else None
        parent = target.parent
        parent_st = (base / rel).parent.stat() if (base / rel).parent.is_dir() else None
        target.unlink(missing_ok=True)
        target.write_bytes(files[rel].encode("utf-8"))
        if st is not None:
            os.chown(target, st.st_uid, st.st_gid)
            os.chmod(target, st.st_mode & 0o7777)
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        if parent_st is not None:
            os.utime(parent, ns=(parent_st.st_atime_ns, parent_st.st_mtime_ns))


def _read_back(workspace: Path, rel: str) -> str | None:
    path = workspace / rel
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def run_forked(base: Path, runs: list[ForkedRun], *, limits: SandboxLimits, script: str, timeout_s: float,
               parallel: int, python_env: str | Path | None = None, env: dict[str, str] | None = None,
               tmp_root: str | None = None) -> list[ForkedResult]:
    """Every run, at most `parallel` at a time, in the caller's order. `script`: "module" (`python -m pytest`) or
    "console" (the `pytest` script of the environment)."""
    if not runs:
        return []
    paths = {tuple(sorted(r.files)) for r in runs}
    if len(paths) != 1:
        raise ValueError("every forked run must write the same paths (only their contents may differ), so that "
                         "nothing but the contents tells the runs apart")
    if script not in ("module", "console"):
        raise ValueError(f"script must be 'module' or 'console' (got {script!r})")
    tmp_root = tmp_root or default_tmp_root()
    order = list(range(len(runs)))
    random.SystemRandom().shuffle(order)  # the position in every list below says nothing about the caller's order
    uids: list[int] = []
    spaces: list[Workspace] = []
    try:
        for i in order:
            uids.append(UIDS.acquire())
            spaces.append(Workspace(base, owner_uid=uids[-1], tmp_root=tmp_root))
            overwrite(spaces[-1].path, base, runs[i].files)
        codes = _zygote([runs[i] for i in order], spaces, uids, limits, script, timeout_s, parallel,
                        python_env, env, tmp_root)
        out: list[ForkedResult | None] = [None] * len(runs)
        for slot, i in enumerate(order):
            code, timed_out = codes[slot]
            out[i] = ForkedResult(code, timed_out, _read_back(spaces[slot].path, runs[i].read))
        return [r for r in out if r is not None]
    finally:
        for ws, uid in zip(spaces, uids):
            close_in_background(ws, functools.partial(UIDS.release, uid))
        for uid in uids[len(spaces):]:
            UIDS.release(uid)


def _zygote(runs: list[ForkedRun], spaces: list[Workspace], uids: list[int], limits: SandboxLimits, script: str,
            timeout_s: float, parallel: int, python_env: str | Path | None, env: dict[str, str] | None,
            tmp_root: str) -> list[tuple[int, bool]]:
    """(exit status, timed out) per run, from one zygote sandbox."""
    tmp_bytes = limits.file_size_mb * 1024 * 1024 * 4
    system, _ = bwrap_view_args(tmp_root, tmp_bytes)
    bin_dir = f"{BWRAP_PYTHON_ENV}/bin" if python_env is not None else str(Path(sys.executable).parent)
    argv = [*system]
    for cap in CAPS:
        argv += ["--cap-add", cap]
    if python_env is not None:
        argv += ["--ro-bind", os.path.realpath(python_env), BWRAP_PYTHON_ENV]
    for slot, ws in enumerate(spaces):
        argv += ["--bind", str(ws.path), f"{RUNS_DIR}/{slot}"]
    argv += ["--chdir", "/", "--", f"{bin_dir}/python", "-c", ZYGOTE_SOURCE.read_text()]
    run_env = {"PATH": f"{bin_dir}:{default_path()}" if python_env is not None else default_path(),
               "HOME": BWRAP_WORKSPACE, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb"}
    if python_env is not None:
        run_env["VIRTUAL_ENV"] = BWRAP_PYTHON_ENV
    run_env.update(env or {})
    job = {"runs": [{"dir": f"{RUNS_DIR}/{slot}", "uid": uid, "argv": r.argv,
                     "script": "module" if script == "module" else f"{bin_dir}/pytest"}
                    for slot, (r, uid) in enumerate(zip(runs, uids))],
           "env": run_env, "timeout_s": timeout_s, "parallel": parallel, "tmp_bytes": tmp_bytes,
           "keep": under_tmp(python_roots()[0]),  # bound again over each run's fresh /tmp
           "limits": {"cpu": limits.cpu_time_s, "as": limits.memory_mb * 1024 * 1024, "nproc": limits.max_procs,
                      "fsize": limits.file_size_mb * 1024 * 1024}}
    waves = -(-len(runs) // max(1, parallel))
    proc = subprocess.Popen(argv, env=run_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, cwd="/")
    try:
        stdout, stderr = proc.communicate(json.dumps(job).encode(), timeout=timeout_s * waves + 30)
    except subprocess.TimeoutExpired:
        proc.kill()  # bwrap's pid 1 dies with it (--die-with-parent), and every run's namespace with that
        stdout, stderr = proc.communicate()
    codes: list[tuple[int, bool]] = [(125, False)] * len(runs)
    done = False
    for line in stdout.decode(errors="replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("done"):
            done = True
        elif isinstance(msg.get("run"), int) and 0 <= msg["run"] < len(runs):
            codes[msg["run"]] = (int(msg["status"]), bool(msg["timed_out"]))
    if not done:
        raise RuntimeError(f"the grading zygote failed (exit {proc.returncode}): "
                           f"{stderr.decode(errors='replace').strip()[-2000:]}")
    return codes
