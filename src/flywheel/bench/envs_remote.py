"""Environment figures of services, remote environments and sandbox start-up: `flywheel bench envs_remote --out FILE`.

Summary keys (issue 27's `bench envs` quotes them; `sandbox_figures`, `remote_figures` and `services_figures` are
what `bench/envs.py` calls):

* `sandbox_p50_ms_repo_env` / `sandbox_p50_ms_plain`: create a sandbox, run `python -c pass`, close it — with a
  per-repository Python environment bound in (a venv built here in a temp dir, bound read-only by
  `create_sandbox(python_env=...)`, its `python` first on PATH) and without (the run's own Python), interleaved
  in one run after a warm-up; `repo_env_ratio` is their quotient (target <= 2).
* `remote_step_overhead_ms`: p50 of one `step` (a `view` call) through `flywheel env-server` (a child process on
  loopback, the client `RemoteEnv`) minus the p50 of the same step on an in-process `CodingEnv`, same task,
  interleaved (target <= 20 ms).
* `postgres_start_s_p50`: a task's PostgreSQL service from nothing to ready (initdb, start, createdb), and
  `services_teardown_ms_p50`.

The load average at start and end is recorded: on a shared machine the figures compare only within one run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flywheel.config import EnvConfig
from flywheel.envs.env import CodingEnv
from flywheel.envs.remote_client import RemoteEnv
from flywheel.sandbox import services
from flywheel.sandbox.sandbox import SandboxLimits, create_sandbox, flush_closed, materialize_base
from flywheel.tasks.synth import generate_tasks
from flywheel.types import ToolCall

TOKEN_ENV = "FLYWHEEL_ENV_TOKEN"


def _p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def build_small_venv(dest: Path) -> Path:
    """A venv without pip (a few files, milliseconds): the stand-in for a per-repository environment."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, capture_output=True)
    return dest


def sandbox_figures(num: int = 60, warmup: int = 5, python_env: str | Path | None = None) -> dict[str, Any]:
    """create -> `python -c pass` -> close, p50 in ms, with and without a bound environment (interleaved)."""
    if "python_env" not in inspect.signature(create_sandbox).parameters:
        return {"skipped": "create_sandbox has no python_env (per-repository environments are not in this tree)"}
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-envs-"))
    try:
        base = materialize_base({"a.py": "x = 1\n"}, tmp / "base")
        venv = Path(python_env) if python_env else build_small_venv(tmp / "venv")
        limits = SandboxLimits()
        times: dict[str, list[float]] = {"plain": [], "repo_env": []}
        outputs = set()
        for i in range(warmup + num):
            for name in ("plain", "repo_env") if i % 2 == 0 else ("repo_env", "plain"):
                extra: dict[str, Any] = {"python_env": venv} if name == "repo_env" else {}
                t0 = time.perf_counter()
                sb = create_sandbox(base, limits, **extra)
                r = sb.run("python -c 'import sys; print(sys.prefix)'" if i == 0 else "python -c pass")
                sb.close()
                dt = (time.perf_counter() - t0) * 1000
                if r.returncode != 0:
                    raise RuntimeError(f"sandbox ({name}) failed: {r.output[-500:]}")
                if i == 0:
                    outputs.add((name, r.stdout.strip()))
                elif i >= warmup:
                    times[name].append(dt)
        flush_closed()
        plain, repo = _p(times["plain"], 0.5), _p(times["repo_env"], 0.5)
        return {"sandbox_p50_ms_plain": round(plain, 2), "sandbox_p50_ms_repo_env": round(repo, 2),
                "repo_env_ratio": round(repo / plain, 3), "sandbox_p90_ms_plain": round(_p(times["plain"], 0.9), 2),
                "sandbox_p90_ms_repo_env": round(_p(times["repo_env"], 0.9), 2), "n": num,
                "python_prefix_seen": dict(outputs)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _start_server(cache: Path, token: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, **{TOKEN_ENV: token})
    proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "env-server", "--port", "0", "--cache-dir",
                             str(cache)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"env-server did not start: {line}")
    return proc, line.split("listening on ", 1)[1].strip()


def remote_figures(num: int = 200, warmup: int = 20) -> dict[str, Any]:
    """p50 of a `view` step through the env-server and in-process, interleaved; overhead = the difference."""
    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-remote-"))
    token = os.urandom(16).hex()
    proc, url = _start_server(tmp / "server", token)
    try:
        task = generate_tasks(1, seed=0, difficulty="easy")[0]
        path = next(p for p in task.files if not Path(p).name.startswith("test_") and p.endswith(".py")
                    and p != "runtests.py")
        call = [ToolCall("view", {"path": path})]
        cfg = EnvConfig()
        times: dict[str, list[float]] = {"local": [], "remote": []}
        with CodingEnv(cfg, tmp / "local") as local, RemoteEnv(cfg, url, token) as remote:
            first = (local.reset(task), remote.reset(task))
            assert first[0] == first[1], "the server's session differs from the local one"
            for i in range(warmup + num):
                for name, env in (("local", local), ("remote", remote)) if i % 2 == 0 else \
                        (("remote", remote), ("local", local)):
                    t0 = time.perf_counter()
                    obs, _ = env.step(call)
                    dt = (time.perf_counter() - t0) * 1000
                    if i >= warmup:
                        times[name].append(dt)
            same = local.step(call) == remote.step(call)
        lo, re = _p(times["local"], 0.5), _p(times["remote"], 0.5)
        return {"remote_step_overhead_ms": round(re - lo, 3), "remote_step_p50_ms": round(re, 3),
                "local_step_p50_ms": round(lo, 3), "remote_step_p90_ms": round(_p(times["remote"], 0.9), 3),
                "local_step_p90_ms": round(_p(times["local"], 0.9), 3), "same_observations": same, "n": num,
                "step": "view of the task's module (a host-side tool: what remains is HTTP + JSON)"}
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


def services_figures(num: int = 5) -> dict[str, Any]:
    """A PostgreSQL service from nothing to ready, and its teardown."""
    if not services.available() or services.postgres_bin() is None:
        return {"skipped": "needs root, network namespaces, bubblewrap and PostgreSQL"}
    specs = services.parse_services([{"kind": "postgres"}])
    start, stop = [], []
    for _ in range(num + 1):
        t0 = time.perf_counter()
        svc = services.start_services(specs)
        t1 = time.perf_counter()
        svc.close()
        t2 = time.perf_counter()
        start.append(t1 - t0)
        stop.append((t2 - t1) * 1000)
    return {"postgres_start_s_p50": round(statistics.median(start[1:]), 3),
            "services_teardown_ms_p50": round(statistics.median(stop[1:]), 2), "n": num}


def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    load_start = _load()
    sandbox = sandbox_figures(num=20 if quick else 100)
    remote = remote_figures(num=50 if quick else 300)
    svc = services_figures(num=2 if quick else 5)
    summary: dict[str, Any] = {}
    for part in (sandbox, remote, svc):
        summary.update({k: v for k, v in part.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                        and k != "n"})
    return {"summary": summary, "sandbox": sandbox, "remote": remote, "services": svc,
            "targets": {"repo_env_ratio_max": 2.0, "remote_step_overhead_ms_max": 20.0},
            "load_avg_1m": {"start": load_start, "end": _load()}, "quick": quick}
