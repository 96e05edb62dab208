"""Benchmark: one engine pool — users' latency with and without background RL rollouts, rollouts on what is left.

    flywheel bench pool --out benchmarks/results/pool.json [--quick]

Two `flywheel serve` child processes on loopback, one after the other, the same tiny 2-layer policy (learner off):

1. baseline: `online.pool.rollouts = false`; simulated users (online/simulator.py, the official `openai` client,
   four at a time) send `NUM_REQUESTS` chat completions; their latency is the baseline;
2. pool: `online.pool.rollouts = true` (synthetic tasks, the RL loop's agent loop and sandboxed grading, at
   background priority, at most `max_background_rows` batch rows); first `IDLE_S` seconds with no user
   (rollouts per minute on an idle server), then the same users and requests as in 1.

`summary`: user p50/p99 latency (ms) of both phases and their ratio, rollouts per minute while users were served
(the left-over capacity) and while idle, the background rows' peak against their cap, failed requests, and the
machine's load average at the start and the end (figures move with it on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from flywheel.bench.online import ServerProcess, build_policy
from flywheel.online.events import EventLog
from flywheel.online.keys import new_key
from flywheel.online.simulator import Interaction, SimUser, SuggestionTask, simulate

NUM_REQUESTS, IDLE_S = 240, 60.0
QUICK_REQUESTS, QUICK_IDLE_S = 48, 20.0
MAX_TOKENS = 16
CAP = 8
COMMON = ["--online.learner.enabled=false", "--inference.max_batch_size=32", f"--online.serve.max_tokens={MAX_TOKENS}"]
POOL = ["--online.pool.rollouts=true", f"--online.pool.max_background_rows={CAP}", "--online.pool.groups_in_flight=2",
        "--online.pool.num_tasks=32", "--rollout.group_size=4", "--rollout.max_new_tokens=64", "--rollout.max_turns=4"]


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _users(server: ServerProcess) -> list[SimUser]:
    elog = EventLog(server.run_dir / "online.db")
    users = []
    for i in range(4):
        key, rec = new_key(f"user{i}", 100_000, 1 << 16)
        elog.add_key(rec)
        users.append(SimUser(f"user{i}", key, SuggestionTask()))
    elog.close()
    return users


def _serve_users(server: ServerProcess, n: int) -> tuple[list[Interaction], float]:
    t0 = time.monotonic()
    its = asyncio.run(simulate(server.base_url, _users(server), n, "flywheel", max_tokens=MAX_TOKENS, concurrency=4,
                               seed=1))
    return its, time.monotonic() - t0


def _latency(its: list[Interaction]) -> dict:
    ms = [i.latency_ms for i in its if i.ok]
    return {"p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99), "num_ok": len(ms), "num_failed": len(its) - len(ms)}


def run(args: argparse.Namespace) -> dict:
    quick = getattr(args, "quick", False)
    n, idle_s = (QUICK_REQUESTS, QUICK_IDLE_S) if quick else (NUM_REQUESTS, IDLE_S)
    load_start = os.getloadavg()[0]
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-pool-") as tmp:
        root = Path(tmp)
        model_dir = build_policy(root / "model")
        base = ServerProcess(root / "base", model_dir, COMMON)
        try:
            base_its, base_s = _serve_users(base, n)
        finally:
            base.stop()
        pool = ServerProcess(root / "pool", model_dir, COMMON + POOL)
        try:
            admin = pool.key_file.read_text().strip()
            before_idle = pool.status(admin)["pool"]
            time.sleep(idle_s)
            after_idle = pool.status(admin)["pool"]
            pool_its, pool_s = _serve_users(pool, n)
            after_users = pool.status(admin)["pool"]
        finally:
            pool.stop()
    base_lat, pool_lat = _latency(base_its), _latency(pool_its)
    idle_rollouts = after_idle["trajectories"] - before_idle["trajectories"]
    busy_rollouts = after_users["trajectories"] - after_idle["trajectories"]
    summary = {
        "user_p50_ms_alone": base_lat["p50_ms"], "user_p99_ms_alone": base_lat["p99_ms"],
        "user_p50_ms_with_rollouts": pool_lat["p50_ms"], "user_p99_ms_with_rollouts": pool_lat["p99_ms"],
        "p50_ratio": (pool_lat["p50_ms"] / base_lat["p50_ms"]) if base_lat["p50_ms"] and pool_lat["p50_ms"] else None,
        "user_requests_per_s_alone": n / base_s, "user_requests_per_s_with_rollouts": n / pool_s,
        "rollouts_per_min_while_serving": 60.0 * busy_rollouts / pool_s,
        "rollouts_per_min_idle": 60.0 * idle_rollouts / idle_s,
        "rollouts_while_serving": busy_rollouts, "rollouts_idle": idle_rollouts,
        "failed_requests": base_lat["num_failed"] + pool_lat["num_failed"],
        "peak_background_rows": after_users["peak_background_rows"], "max_background_rows": CAP,
        "rollout_mean_reward": after_users["mean_reward"], "failed_rollout_groups": after_users["failed_groups"],
        "num_requests": n, "max_tokens": MAX_TOKENS, "idle_s": idle_s,
        "wall_s": time.time() - t_start, "load_avg_1m_start": load_start, "load_avg_1m_end": os.getloadavg()[0],
    }
    return {"target": "pool", "summary": summary, "baseline": "the same users on the same policy with no background "
            "rollouts (first server of this run)", "config": {"common": COMMON, "pool": POOL},
            "command": "flywheel bench pool" + (" --quick" if quick else "")}
