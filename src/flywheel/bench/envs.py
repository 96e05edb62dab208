"""Real repositories as environments: `flywheel bench envs --out FILE` (14 projects, up to 20 tasks each; `--quick`:
2 projects, 4 tasks each; `--time-budget-s S`: mining gets 70 % of S, split evenly over the projects, each stopping
its candidates past its share).

Per-repository environments, real-code task mining and grading with a repository's own environment, on pinned
source distributions of small pure-Python projects from the package index (PROJECTS), all in one run:

* environments: a fresh environments directory; each project's spec (its own metadata) is built or, when another
  project already needed the same spec, served from the cache. `envs_built` (distinct venvs built),
  `env_build_s_p50` (install seconds of those builds), `env_disk_mb_p50`, `env_cache_hit_rate` (requests served
  from the cache / all requests: one per project while mining, then one per task by `flywheel envs build` on the
  mined file, which must be all hits);
* mining: `mined_tasks` (kept after verification), `mined_yield` (kept / candidate bugs tried), per project and per
  bug kind;
* grading: every kept task verified through envs/reward.py (restored tests, a fresh bwrap sandbox with the task's
  venv bound at /env, the guard): reference fix -> 1, bugged tree -> 0. `grade_s_p50_repo` is the median seconds of
  grading a reference fix (copy, restore, sandbox, pytest with the repository's env, parse), `verified_rate` the
  share that graded right; before it, computed expectations become literals (envs/expected.py; the result's
  `materialised` line), and `verdicts` counts the verified tasks by the path that graded their fix (envs/verify.py).

Sandbox and remote figures (`sandbox_p50_ms_repo_env`, `sandbox_p50_ms_plain`, `remote_step_overhead_ms`) come from
the functions `sandbox_figures` and `remote_figures` below. The mined task file is written beside the result
(`<out>.tasks.jsonl`), referring to the task repositories under `runs/bench-envs/mine`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from flywheel.bench import envs_remote
from flywheel.config import EnvConfig
from flywheel.envs.expected import materialise_tasks
from flywheel.envs.verify import VERDICTS, verify_tasks
from flywheel.tasks.loaders import save_tasks
from flywheel.tasks.mine import mine_project
from flywheel.tasks.repoenv import build_env, env_key
from flywheel.types import Task

PROJECTS = ("inflection==0.5.1", "toolz==0.12.1", "more-itertools==10.2.0", "six==1.16.0", "cachetools==5.3.3",
            "jmespath==1.0.1", "parse==1.20.1", "pathspec==0.12.1", "semver==3.0.2", "funcy==2.0", "isodate==0.6.1",
            "wcwidth==0.2.13", "tabulate==0.9.0", "boltons==24.0.0")
QUICK_PROJECTS = ("inflection==0.5.1", "cachetools==5.3.3")


def _p50(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def sandbox_figures(tasks: list[Task], cfg: EnvConfig) -> dict[str, Any]:
    """`sandbox_p50_ms_repo_env` and `sandbox_p50_ms_plain`: create a sandbox, run `python -c pass`, destroy, with
    and without a Python environment bound in, interleaved, same run (bench/envs_remote.py)."""
    return envs_remote.sandbox_figures()


def remote_figures(tasks: list[Task], cfg: EnvConfig) -> dict[str, Any]:
    """`remote_step_overhead_ms`: an env-server step against an in-process step on the same task
    (bench/envs_remote.py)."""
    return envs_remote.remote_figures()


def run(args: Any) -> dict:
    quick = bool(getattr(args, "quick", False))
    projects = QUICK_PROJECTS if quick else PROJECTS
    per_project = 4 if quick else 20
    work = Path("runs/bench-envs")
    work.mkdir(parents=True, exist_ok=True)
    envs_dir = Path(tempfile.mkdtemp(prefix="envs-", dir=work))  # fresh: every first build is timed
    cfg = EnvConfig(grade_cache=0, python_envs_dir=str(envs_dir))
    result: dict[str, Any] = {"load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "projects": {}}
    requests, hits, builds = 0, 0, []
    tasks: list[Task] = []
    tried = 0
    budget_s = getattr(args, "time_budget_s", None)
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"--time-budget-s must be a positive number of seconds (got {budget_s})")
    per_project_s = None if budget_s is None else 0.7 * budget_s / len(projects)
    result["time_budget_s"], result["per_project_mine_s"] = budget_s, per_project_s
    t0 = time.perf_counter()
    for pin in projects:
        got, rep = mine_project(pin, work / "mine", envs_dir, max_tasks=per_project, seed=0, time_limit_s=per_project_s)
        if rep.env is not None:
            requests += 1
            hits += rep.env.status == "cached"
            if rep.env.status == "built":
                builds.append(rep.env)
        tried += rep.tried
        tasks += got
        result["projects"][pin] = {"tried": rep.tried, "kept_mined": rep.kept, "by_kind": rep.by_kind,
                                   "baseline_tests": rep.baseline_passed, "baseline_s": round(rep.baseline_s, 2),
                                   "env": rep.env.key if rep.env else None, "env_status": rep.env.status if rep.env
                                   else None, "mine_s": round(rep.mine_s, 1), "error": rep.error[:400],
                                   "rejected": rep.rejected, "timeouts": rep.timeouts[:20],
                                   "time_limited": rep.time_limited}
    mine_s = time.perf_counter() - t0
    # every task asks for its environment again, as `flywheel envs build` does: all must be cache hits
    for t in tasks:
        assert t.python_env is not None
        b = build_env(t.python_env, envs_dir)
        requests += 1
        hits += b.status == "cached"
    t1 = time.perf_counter()
    tasks, result["materialised"] = materialise_tasks(tasks, envs_dir)  # computed expectations as literals: twins
    result["materialise_s"] = round(time.perf_counter() - t1, 1)
    t1 = time.perf_counter()
    results = verify_tasks(tasks, cfg)
    verify_s = time.perf_counter() - t1
    ok = {r.task_id for r in results if r.ok}
    kept = [t for t in tasks if t.id in ok]
    for pin in projects:
        name = pin.replace("==", "-")
        result["projects"][pin]["verified"] = sum(1 for t in kept if t.meta.get("project") == name)
    out = Path(getattr(args, "out", None) or "benchmarks/results/envs.json")
    save_tasks(kept, out.with_suffix(".tasks.jsonl"))
    result["wrong"] = [{"task": r.task_id, "solved": r.solved, "untouched": r.untouched, "flags": r.flags,
                        "error": r.error[:300]} for r in results if not r.ok][:20]
    result["builds"] = [{"key": b.key, "name": b.name, "install_s": round(b.install_s, 2),
                         "disk_mb": round(b.disk_bytes / 2**20, 1), "packages": b.packages} for b in builds]
    result["mine_s"], result["verify_s"] = round(mine_s, 1), round(verify_s, 1)
    result["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    summary: dict[str, Any] = {
        "envs_built": len(builds),
        "env_build_s_p50": _p50([b.install_s for b in builds]),
        "env_disk_mb_p50": _p50([b.disk_bytes / 2**20 for b in builds]),
        "env_cache_hit_rate": round(hits / requests, 4) if requests else None,
        "mined_tasks": len(kept),
        "mined_yield": round(len(kept) / tried, 4) if tried else None,
        "mined_projects": sum(1 for p in result["projects"].values() if p["verified"]),
        "verified_rate": round(len(kept) / len(tasks), 4) if tasks else None,
        "grade_s_p50_repo": _p50([r.grade_s for r in results if r.ok]),
        "verdicts": {k: sum(1 for r in results if r.ok and r.verdict == k) for k in VERDICTS},
        "distinct_envs": len({env_key(t.python_env) for t in kept if t.python_env is not None}),
    }
    summary.update(sandbox_figures(kept, cfg))
    summary.update(remote_figures(kept, cfg))
    result["summary"] = summary
    return result
