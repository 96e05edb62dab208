"""Benchmark: real-time RL against simulated users — accept rate before/after, the gate, deploys under load.

    flywheel bench online --out benchmarks/results/online.json [--quick] [--run-dir runs/bench-online/online]
    flywheel dashboard runs/bench-online             # its deploys, rollbacks and accept rate, live (Online view)

`flywheel serve` runs as a child process on loopback (a tiny 2-layer policy built here, learner and gate on).
Simulated users with a hidden preference (online/simulator.py) talk to it through the official `openai` client,
four at a time, and send accept/reject feedback on every suggestion (the Tab mapping: +0.75 / -0.25):

1. before: the first `NUM_BEFORE` interactions, all served by version 0 (the learner has not proposed yet);
2. learn: honest users keep going; the learner proposes a candidate every 48 events, the gate tests it on
   held-out prompts, the server installs what passes;
3. poison: a burst of feedback from keys whose users report the opposite of their preference (accept what
   they dislike). The gate must reject what it learned, or the live monitor roll it back;
4. after: honest users again; their accept rate is `accept_rate_after`.

`summary`: accept_rate_before / accept_rate_after (the baseline is the same server's version 0, measured in the
same run), deploys, rollbacks, gate_rejects, poisoned_requests_served (requests answered by a version trained
mostly, at least half, on poisoned feedback whose held-out score is more than 0.05 below that of the version the
learner started from when it first trained on poisoned feedback: the harm the burst did;
`tainted_requests_served` counts those of every version that learned from any poisoned feedback, harmful or not),
dropped_requests (requests or feedback calls that failed),
p50/p99_latency_ms while deploying (requests in flight between a deploy event and 0.5 s after the server
installed it) with p50/p99 of all requests beside them, feedback_to_deploy_s (the last feedback event a candidate
learned from to the server serving it; median), and the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from flywheel.online.events import EventLog
from flywheel.online.keys import new_key
from flywheel.online.serve_process import ServerProcess, build_policy
from flywheel.online.simulator import Interaction, SimUser, SuggestionTask, simulate

TARGETS = {"accept_rate_gain": 0.10, "dropped_requests": 0, "poisoned_requests_served": 0}
MAX_HARM = 0.05  # a version trained on the burst is harmful when its held-out score is this far below the pre-burst one
PHASES = {"before": 96, "learn": 960, "poison": 384, "after": 256}
QUICK = {"before": 48, "learn": 240, "poison": 96, "after": 96}
def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _accept(its: list[Interaction]) -> float | None:
    ok = [i for i in its if i.ok and i.feedback_ok]
    return sum(i.signal == "accept" for i in ok) / len(ok) if ok else None


def run(args: argparse.Namespace) -> dict:
    phases = QUICK if getattr(args, "quick", False) else PHASES
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-online-") as tmp:
        root = Path(tmp)
        run_dir = Path(args.run_dir) if getattr(args, "run_dir", None) else root / "run"
        if (run_dir / "online.db").exists():
            raise SystemExit(f"flywheel bench online: {run_dir} already holds an event log (online.db); pass a new "
                             "--run-dir, so this run's figures are its own")
        model_dir = build_policy(root / "model")
        server = ServerProcess(run_dir, model_dir)
        try:
            return _run(server, phases, t_start)
        finally:
            server.stop()


def _run(server: ServerProcess, phases: dict[str, int], t_start: float) -> dict:
    elog = EventLog(server.run_dir / "online.db")
    task = SuggestionTask()
    honest, poison = [], []
    for i in range(4):
        key, rec = new_key(f"user{i}", 100_000, 1 << 16)
        elog.add_key(rec)
        honest.append(SimUser(f"user{i}", key, task, accept_liked=0.9, accept_other=0.1))
    for i in range(4):
        key, rec = new_key(f"mallory{i}", 100_000, 1 << 16)
        elog.add_key(rec)
        poison.append(SimUser(f"mallory{i}", key, task, accept_liked=0.9, accept_other=0.1, poison=True))
    poison_key_ids = {r.key_id for r in elog.keys() if r.name.startswith("mallory")}
    admin = server.key_file.read_text().strip()

    def phase(users: list[SimUser], n: int, seed: int) -> list[Interaction]:
        return asyncio.run(simulate(server.base_url, users, n, "flywheel", max_tokens=4, concurrency=4, seed=seed,
                                    stream_every=7))

    out: dict[str, list[Interaction]] = {}
    marks = {}
    for name, users, seed in (("before", honest, 1), ("learn", honest, 2), ("poison", poison, 3)):
        marks[name] = time.time()
        out[name] = phase(users, phases[name], seed)
    # the learner trails the traffic (by minutes on a loaded 2-core machine): let it train on the whole burst and
    # put its candidates through the gate before the honest users come back
    _wait_for_candidates(elog, time.time() + 300)
    marks["after"] = time.time()
    out["after"] = phase(honest, phases["after"], 4)
    _wait_for_candidates(elog, time.time() + 120)
    status = server.status(admin)
    events = elog.events()
    return _summarize(out, events, status, poison_key_ids, marks, t_start)


def _wait_for_candidates(elog: EventLog, deadline: float) -> None:
    """Until the learner has caught up with the feedback (its last candidate covers nearly all of it)."""
    while time.time() < deadline:
        fb = elog.counts()["feedback"]
        cands = [e for e in elog.events(("candidate",))]
        last = max((int(e.data.get("feedback_seq_last", 0)) for e in cands), default=0)
        judged = {e.version for e in elog.events(("gate_pass", "gate_reject"))}
        if fb - last < 48 and all(c.version in judged for c in cands):
            return
        time.sleep(1.0)


def _summarize(out: dict[str, list[Interaction]], events, status: dict, poison_key_ids: set[str],
               marks: dict[str, float], t_start: float) -> dict:
    all_its = [i for its in out.values() for i in its]
    cands = {e.version: e for e in events if e.kind == "candidate"}
    def poison_share(e) -> float:
        per_key = e.data.get("events_per_key", {})
        return sum(n for k, n in per_key.items() if k in poison_key_ids) / max(sum(per_key.values()), 1)

    # held-out score of each version the gate judged, and the version serving when the burst began
    score = {e.version: e.data["candidate"]["score"] for e in events if e.kind in ("gate_pass", "gate_reject")}
    score.update({e.data["serving_version"]: e.data["serving"]["score"] for e in events
                  if e.kind in ("gate_pass", "gate_reject")})
    # the version the learner started from when it first trained on poisoned feedback (it lags the traffic)
    first_tainted = [e for v, e in sorted(cands.items()) if poison_share(e) > 0]
    before_burst = int(first_tainted[0].data["base_version"]) if first_tainted else None
    floor = score.get(before_burst, 0.0) - MAX_HARM if before_burst is not None else 0.0
    # poisoned: trained mostly (at least half) on poisoned feedback and worse on the held-out suite than the version
    # that served when the burst began; tainted: trained on any poisoned feedback, harmful or not
    tainted_versions = {v for v, e in cands.items() if poison_share(e) > 0}
    poisoned_versions = {v for v, e in cands.items() if poison_share(e) >= 0.5 and score.get(v, 0.0) < floor}
    deploys = [e for e in events if e.kind == "deploy" and e.version]
    rollbacks = [e for e in events if e.kind == "rollback"]
    rejects = [e for e in events if e.kind == "gate_reject"]
    installs = status.get("installs", [])
    windows = [(i["event_s"], i["installed_s"] + 0.5) for i in installs]
    during = [i.latency_ms for i in all_its if i.ok and any(a <= i.t_end and i.t_start <= b for a, b in windows)]
    lat = [i.latency_ms for i in all_its if i.ok]
    to_deploy = []
    for inst in installs:
        c = cands.get(inst["version"])
        if c is not None and "last_feedback_s" in c.data:
            to_deploy.append(inst["installed_s"] - float(c.data["last_feedback_s"]))
    before, after = _accept(out["before"]), _accept(out["after"])
    before_v0 = [i for i in out["before"] if i.weight_version == 0]
    summary: dict[str, Any] = {
        "accept_rate_before": before, "accept_rate_after": after,
        "accept_rate_gain": (after - before) if before is not None and after is not None else None,
        "liked_rate_before": sum(i.liked for i in before_v0) / max(len(before_v0), 1),
        "liked_rate_after": sum(i.liked for i in out["after"] if i.ok) / max(len(out["after"]), 1),
        "deploys": len(deploys), "rollbacks": len(rollbacks), "gate_rejects": len(rejects),
        "poisoned_versions": sorted(poisoned_versions),
        "poisoned_versions_deployed": sorted(poisoned_versions & {e.version for e in deploys}),
        "poisoned_requests_served": sum(i.weight_version in poisoned_versions for i in all_its if i.ok),
        "version_before_burst": before_burst, "heldout_score_before_burst": score.get(before_burst),
        "heldout_score_per_version": {v: round(x, 4) for v, x in sorted(score.items())},
        "tainted_versions_deployed": sorted(tainted_versions & {e.version for e in deploys}),
        "tainted_requests_served": sum(i.weight_version in tainted_versions for i in all_its if i.ok),
        "poison_share_per_candidate": {v: round(poison_share(e), 3) for v, e in sorted(cands.items())},
        "dropped_requests": sum(not (i.ok and i.feedback_ok) for i in all_its),
        "num_requests": len(all_its),
        "p50_latency_ms": _pct(during, 0.5), "p99_latency_ms": _pct(during, 0.99), "num_requests_deploying": len(during),
        "p50_latency_ms_all": _pct(lat, 0.5), "p99_latency_ms_all": _pct(lat, 0.99),
        "feedback_to_deploy_s": statistics.median(to_deploy) if to_deploy else None,
        "wall_s": time.time() - t_start, "load_avg_1m": os.getloadavg()[0],
    }
    gain = summary["accept_rate_gain"]
    summary["meets_targets"] = bool(gain is not None and gain >= TARGETS["accept_rate_gain"]
                                    and summary["dropped_requests"] == 0 and summary["poisoned_requests_served"] == 0)
    return {"target": "online", "summary": summary, "targets": TARGETS,
            "phases": {k: len(v) for k, v in out.items()},
            "events": [{"kind": e.kind, "version": e.version, "reason": e.reason, "t_s": e.created_s - t_start}
                       for e in events if e.kind != "candidate"],
            "installs": installs,
            "errors": sorted({i.error for i in all_its if i.error})[:20]}
