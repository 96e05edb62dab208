"""Benchmark: one engine pool — users' latency with and without background RL rollouts, rollouts on what is left.

    flywheel bench pool --out benchmarks/results/pool.json [--quick]

Three `flywheel serve` child processes on loopback, one after the other, the same tiny 2-layer policy (learner off):

1. baseline: `online.pool.rollouts = false`; simulated users (online/simulator.py, the official `openai` client,
   four at a time) send `NUM_REQUESTS` chat completions; their latency is the baseline;
2. pool: `online.pool.rollouts = true` (synthetic tasks, the RL loop's agent loop and sandboxed grading, at
   background priority; 16 sessions in flight, at most `CAP` batch rows and 512 background prompt tokens per step
   beside users); first `IDLE_S` seconds with no user (rollouts per minute on an idle server), then the same
   users and requests as in 1;
3. uncapped: the same rollouts with the cap and the background prefill budget lifted (`max_background_rows` =
   the batch size): admission order alone, what the cap buys.

`summary`: user p50/p99 latency (ms) of each phase, rollouts per minute while users were served (the left-over
capacity) and while idle, the background rows' peak against their cap, failed requests, and the machine's load
average at the start and the end (figures move with it on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from flywheel.online.events import EventLog
from flywheel.online.keys import new_key
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.online.simulator import Interaction, SimUser, SuggestionTask, simulate

NUM_REQUESTS, IDLE_S = 240, 60.0
QUICK_REQUESTS, QUICK_IDLE_S = 48, 20.0
MAX_TOKENS = 16
CAP = 8
COMMON = ["--online.learner.enabled=false", "--inference.max_batch_size=32", f"--online.serve.max_tokens={MAX_TOKENS}"]
POOL = ["--online.pool.rollouts=true", "--online.pool.groups_in_flight=4", "--online.pool.num_tasks=32",
        "--rollout.group_size=4", "--rollout.max_new_tokens=64", "--rollout.max_turns=4"]
CAPPED = [f"--online.pool.max_background_rows={CAP}", "--online.pool.max_background_prefill_tokens=512"]
UNCAPPED = ["--online.pool.max_background_rows=32", "--online.pool.max_background_prefill_tokens=4096"]


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


def _pool_phase(run_dir: Path, model_dir: Path, args: list[str], n: int, idle_s: float) -> dict:
    """A server with background rollouts: `idle_s` with no user (rollouts per minute), then the users."""
    server = ServerProcess(run_dir, model_dir, args)
    try:
        admin = server.key_file.read_text().strip()
        t0 = time.monotonic()
        at_start = server.status(admin)["pool"]
        time.sleep(idle_s)
        idle = server.status(admin)["pool"]
        idle_elapsed = time.monotonic() - t0
        its, users_s = _serve_users(server, n)
        end = server.status(admin)["pool"]
    finally:
        server.stop()
    lat = _latency(its)
    return {**lat, "requests_per_s": n / users_s,
            "rollouts_per_min_idle": (60.0 * (idle["trajectories"] - at_start["trajectories"]) / idle_elapsed
                                      if idle_s else None),
            "rollouts_per_min_serving": 60.0 * (end["trajectories"] - idle["trajectories"]) / users_s,
            "peak_background_rows": end["peak_background_rows"], "mean_reward": end["mean_reward"],
            "failed_groups": end["failed_groups"]}


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
        pool = _pool_phase(root / "pool", model_dir, COMMON + POOL + CAPPED, n, idle_s)
        free = _pool_phase(root / "uncapped", model_dir, COMMON + POOL + UNCAPPED, n, 0.0)
    base_lat = _latency(base_its)
    summary = {
        "user_p50_ms_alone": base_lat["p50_ms"], "user_p99_ms_alone": base_lat["p99_ms"],
        "user_p50_ms_with_rollouts": pool["p50_ms"], "user_p99_ms_with_rollouts": pool["p99_ms"],
        "user_p50_ms_with_uncapped_rollouts": free["p50_ms"], "user_p99_ms_with_uncapped_rollouts": free["p99_ms"],
        "user_requests_per_s_alone": n / base_s, "user_requests_per_s_with_rollouts": pool["requests_per_s"],
        "user_requests_per_s_with_uncapped_rollouts": free["requests_per_s"],
        "rollouts_per_min_while_serving": pool["rollouts_per_min_serving"],
        "rollouts_per_min_while_serving_uncapped": free["rollouts_per_min_serving"],
        "rollouts_per_min_idle": pool["rollouts_per_min_idle"],
        "failed_requests": base_lat["num_failed"] + pool["num_failed"] + free["num_failed"],
        "peak_background_rows": pool["peak_background_rows"], "max_background_rows": CAP,
        "peak_background_rows_uncapped": free["peak_background_rows"],
        "rollout_mean_reward": pool["mean_reward"], "failed_rollout_groups": pool["failed_groups"] + free["failed_groups"],
        "num_requests": n, "max_tokens": MAX_TOKENS, "idle_s": idle_s,
        "wall_s": time.time() - t_start, "load_avg_1m_start": load_start, "load_avg_1m_end": os.getloadavg()[0],
    }
    return {"target": "pool", "summary": summary,
            "baseline": "the same users on the same policy with no background rollouts (first server of this run)",
            "config": {"common": COMMON, "pool": POOL, "capped": CAPPED, "uncapped": UNCAPPED},
            "command": "flywheel bench pool" + (" --quick" if quick else "")}
