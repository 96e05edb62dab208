"""Sandbox benchmark: `flywheel bench sandbox --out FILE` (`--quick` for a smoke run).

One task whose workspace holds 2,000 files (50 MB). For `bwrap` and `local` side by side, interleaved
so that machine noise hits both alike:

* latency: create the copy-on-write workspace and the sandbox -> run `true` -> close; p50/p99 over
  200 sandboxes one after another;
* burst: 200 sandboxes of that task submitted at once to a thread pool; sandboxes/s until all have run
  and closed;
* grading throughput: synthetic tasks (`envs.synth.generate_tasks`) with their known solution graded by
  `envs.reward.grade` (hidden tests in a fresh sandbox), tasks/s with one grading thread per core;
* the test runner: `python runtests.py` of a synthetic task, failing and fixed, in one sandbox, p50 over 40
  runs each; baseline in the same sandbox, interleaved: `python -c pass`, the interpreter's start.

Baselines measured in the same run: a bare `bwrap --ro-bind / / true` started like the sandboxes (in a
session of its own; the burst also without, as the first version measured it) — the floor any bwrap
sandbox pays — and a full copy of the workspace (`cp -a`, what O(1) copy-on-write avoids). A burst
counts until every workspace is unmounted and removed (`flush_closed`), not only until `close()`
returned. The load average at start and end is recorded: the figures are only comparable within a run.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flywheel.sandbox.sandbox import SandboxLimits, bwrap_available, create_sandbox, describe_host, flush_closed
from flywheel.sandbox.workspace import Workspace, materialize_base
from flywheel.tasks.synth import generate_tasks

NUM_FILES = 2000
TOTAL_MB = 50


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _stats(xs_ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(_pct(xs_ms, 0.5), 3), "p99_ms": round(_pct(xs_ms, 0.99), 3),
            "mean_ms": round(statistics.fmean(xs_ms), 3), "n": len(xs_ms)}


def build_task_files(num_files: int = NUM_FILES, total_mb: int = TOTAL_MB, seed: int = 0) -> dict[str, str]:
    """A synthetic repository: `num_files` text files totalling `total_mb` MiB in 40 directories."""
    r = random.Random(seed)
    size = total_mb * 1024 * 1024 // num_files
    alphabet = "abcdefghijklmnopqrstuvwxyz_ =()\n"
    block = "".join(r.choice(alphabet) for _ in range(size + 4096))
    return {f"pkg{i % 40:02d}/mod_{i:04d}.py": block[i % 4096: i % 4096 + size] for i in range(num_files)}


def _cpu_s() -> float:
    """CPU seconds of this process and of every child it has waited for (bwrap, bash, ...)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _one(base: Path, limits: SandboxLimits, kind: str) -> float:
    t0 = time.perf_counter()
    sb = create_sandbox(base, limits, kind)
    try:
        r = sb.run("true")
    finally:
        sb.close()
    if r.returncode != 0:
        raise RuntimeError(f"{kind} sandbox failed to run `true`: {r.output[:500]}")
    return (time.perf_counter() - t0) * 1000


def _burst(base: Path, limits: SandboxLimits, kind: str, num: int, num_threads: int) -> dict[str, float]:
    flush_closed()
    with ThreadPoolExecutor(max_workers=num_threads) as pool:
        t0 = time.perf_counter()
        lat = list(pool.map(lambda _: _one(base, limits, kind), range(num)))
        flush_closed()  # until every workspace is unmounted and removed too, not only until close() returned
        wall = time.perf_counter() - t0
    return {"per_s": round(num / wall, 1), "wall_s": round(wall, 3), "num": num, "num_threads": num_threads,
            "latency_p50_ms": round(_pct(lat, 0.5), 2), "latency_p99_ms": round(_pct(lat, 0.99), 2)}


def _bare_bwrap(new_session: bool) -> None:
    subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"], check=True, start_new_session=new_session)


def _bare_burst(num: int, num_threads: int, new_session: bool) -> float:
    with ThreadPoolExecutor(max_workers=num_threads) as pool:
        t = time.perf_counter()
        list(pool.map(lambda _: _bare_bwrap(new_session), range(num)))
        return round(num / (time.perf_counter() - t), 1)


def _grading(num_tasks: int, num_threads: int) -> dict[str, object]:
    try:
        from flywheel.config import EnvConfig
        from flywheel.envs.reward import grade
        from flywheel.tasks.synth import generate_tasks
    except ImportError as err:  # the grader is another part; report the gap rather than fail
        return {"error": f"grader unavailable: {err}"}
    tasks = generate_tasks(num_tasks, seed=0)
    cfg = EnvConfig()
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-grade-"))
    try:
        workspaces = []
        for i, t in enumerate(tasks):
            ws = tmp / f"ws{i}"
            for rel, text in {**t.files, **(t.solution or {})}.items():
                (ws / rel).parent.mkdir(parents=True, exist_ok=True)
                (ws / rel).write_text(text)
            workspaces.append(ws)
        with ThreadPoolExecutor(max_workers=num_threads) as pool:
            t0 = time.perf_counter()
            rewards = list(pool.map(lambda tw: grade(tw[0], tw[1], cfg), zip(tasks, workspaces)))
            wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"grades_per_s": round(len(tasks) / wall, 2), "num_tasks": len(tasks), "num_threads": num_threads,
            "wall_s": round(wall, 2), "mean_reward_of_solutions": round(statistics.fmean(r.value for r in rewards), 3)}


def _runner(num_runs: int, kind: str) -> dict[str, object]:
    """`python runtests.py -q --junitxml=...` (tasks/minitest.py, what grading and `run_tests` run) on a synthetic
    task, failing and fixed, in one sandbox; interleaved with `python -c pass`, the interpreter's floor."""
    task = generate_tasks(1, seed=0)[0]
    cmds = {"failing": "python runtests.py -q --junitxml=/tmp/r.xml", "floor": "python -c pass"}
    times: dict[str, list[float]] = {"failing": [], "passing": [], "floor": []}
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-runner-"))
    try:
        for fixed in (False, True):
            base = materialize_base({**task.files, **((task.solution or {}) if fixed else {})}, tmp / f"base{fixed}")
            with create_sandbox(base, SandboxLimits(), kind=kind) as sb:
                for _ in range(num_runs):
                    for name, cmd in cmds.items():
                        t = time.perf_counter()
                        sb.run(cmd)
                        key = "passing" if fixed and name == "failing" else name
                        times[key].append((time.perf_counter() - t) * 1000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"kind": kind, **{f"{k}_p50_ms": round(statistics.median(v), 1) for k, v in times.items()}}


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    num_seq = 30 if quick else 200
    num_burst = 50 if quick else 200
    num_copy = 3 if quick else 10
    num_tasks = 4 if quick else 24
    num_runner = 5 if quick else 40
    kinds = ["bwrap", "local"] if bwrap_available() else ["local"]
    limits = SandboxLimits()
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-sandbox-"))
    result: dict = {"host": describe_host(), "task": {"num_files": NUM_FILES, "total_mb": TOTAL_MB},
                    "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}
    try:
        t0 = time.perf_counter()
        base = materialize_base(build_task_files(), tmp / "base")
        result["task"]["materialize_s"] = round(time.perf_counter() - t0, 3)

        for kind in kinds:  # warm up caches and probes
            _one(base, limits, kind)
        seq: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, float] = {k: 0.0 for k in kinds}
        bare: list[float] = []
        for _ in range(num_seq):  # interleaved with a bare `bwrap true`, so noise hits all alike
            for kind in kinds:
                c0 = _cpu_s()
                seq[kind].append(_one(base, limits, kind))
                cpu[kind] += _cpu_s() - c0
            if "bwrap" in kinds:
                t = time.perf_counter()
                _bare_bwrap(new_session=True)  # started the way sandboxes are: in a session of its own
                bare.append((time.perf_counter() - t) * 1000)
        result["sequential"] = {k: {**_stats(v), "cpu_ms_per_sandbox": round(1000 * cpu[k] / num_seq, 2)}
                                for k, v in seq.items()}

        if bare:
            result["baseline_bare_bwrap"] = _stats(bare)
        copies = []
        for _ in range(num_copy):
            t = time.perf_counter()
            Workspace(base, tmp_root=str(tmp), mode="copy").close()
            copies.append((time.perf_counter() - t) * 1000)
        result["baseline_copy_workspace"] = _stats(copies)

        num_threads = 4 * (os.cpu_count() or 1)
        result["burst"] = {k: _burst(base, limits, k, num_burst, num_threads) for k in kinds}
        if "bwrap" in kinds:  # the floor: bare bwrap processes (no workspace, namespaces or limits)
            # in a session of its own like the sandboxes (a session is a scheduler autogroup: on a busy
            # machine that alone doubles a burst's share of the CPU), and in the caller's session
            result["baseline_bare_bwrap_burst_per_s"] = _bare_burst(num_burst, num_threads, new_session=True)
            result["baseline_bare_bwrap_same_session_burst_per_s"] = _bare_burst(num_burst, num_threads, False)
        # the same burst with one thread per sandbox: all of them really started at the same moment
        result["burst_one_thread_each"] = {k: _burst(base, limits, k, num_burst, num_burst) for k in kinds}
        result["grading"] = _grading(num_tasks, os.cpu_count() or 1)
        result["runner"] = _runner(num_runner, kinds[0])
        result["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    summary = {
        "bwrap_p50_ms": result["sequential"].get("bwrap", {}).get("p50_ms"),
        "bwrap_p99_ms": result["sequential"].get("bwrap", {}).get("p99_ms"),
        "local_p50_ms": result["sequential"]["local"]["p50_ms"],
        "local_p99_ms": result["sequential"]["local"]["p99_ms"],
        "bwrap_burst_per_s": result["burst"].get("bwrap", {}).get("per_s"),
        "local_burst_per_s": result["burst"]["local"]["per_s"],
        "grades_per_s": result["grading"].get("grades_per_s"),
        "runtests_failing_p50_ms": result["runner"]["failing_p50_ms"],
        "runtests_passing_p50_ms": result["runner"]["passing_p50_ms"],
        "python_floor_p50_ms": result["runner"]["floor_p50_ms"],
        "bwrap_cpu_ms_per_sandbox": result["sequential"].get("bwrap", {}).get("cpu_ms_per_sandbox"),
        "bare_bwrap_p50_ms": result.get("baseline_bare_bwrap", {}).get("p50_ms"),
        "bwrap_over_bare_p50": (round(result["sequential"]["bwrap"]["p50_ms"] / result["baseline_bare_bwrap"]["p50_ms"], 2)
                                if "baseline_bare_bwrap" in result else None),
        "bare_bwrap_burst_per_s": result.get("baseline_bare_bwrap_burst_per_s"),
        "bwrap_burst_over_bare": (round(result["burst"]["bwrap"]["per_s"] / result["baseline_bare_bwrap_burst_per_s"], 2)
                                  if "baseline_bare_bwrap_burst_per_s" in result else None),
        "copy_workspace_p50_ms": result["baseline_copy_workspace"]["p50_ms"],
        "workspace_mode": result["host"]["workspace_mode"],
        "quick": quick,
    }
    if summary["bwrap_p50_ms"] is not None:
        summary["target_bwrap_p50_ms_le_15"] = summary["bwrap_p50_ms"] <= 15
        summary["target_bwrap_burst_per_s_ge_200"] = summary["bwrap_burst_per_s"] >= 200
    result["summary"] = summary
    return result
