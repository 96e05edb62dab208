"""Benchmark: the dashboard's reader of an online run's event log — first read, incremental polls, memory.

    flywheel bench dashboard_online --out benchmarks/results/dashboard_online.json [--quick]

Writes an event log with the real schema (online/events.py): 200,000 served completions, each with accept or
reject feedback (20,000 with --quick), and a deploy every 10 % of them, in bulk through `EventLog`'s tables (one
transaction: the fsync per record that `flywheel serve` pays would make the set-up minutes long and is not what
is measured). Then, in this process:

* `first_poll_s`: `OnlineLog` (metrics/dashboard/online.py) reads the whole log once, as the dashboard does when
  it finds a run;
* `poll_ms`: a poll after 100 more completions and feedback were recorded the way the server records them
  (`record_completion`, `record_feedback`), and `empty_poll_ms`, a poll that finds nothing new;
* `kept_mb`: Python memory the reader holds after the first read (tracemalloc), `peak_mb` during it;
* `view_kb`: the JSON the page fetches on each change.

Baseline, measured in the same run: the same figures read the way `EventLog` offers them to its own callers
(`feedback_after(0)`: every feedback event with its completion as records), the one read a dashboard importing
online/ would do: its time and the memory it holds.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from flywheel.metrics.dashboard.online import OnlineLog
from flywheel.online.events import COMPLETIONS, FEEDBACK, CompletionRecord, EventLog, EventLogReader, FeedbackRecord

NUM = 200_000
QUICK_NUM = 20_000
NUM_NEW = 100


def write_log(path: Path, num: int, seed: int = 0) -> EventLog:
    """`num` completions with feedback (accepted with probability 0.4), 10 deploys, in one transaction."""
    elog = EventLog(path)
    rng = random.Random(seed)
    t0 = time.time() - num * 0.01
    per_version = max(1, num // 10)
    with elog.engine.begin() as c:
        c.execute(insert(COMPLETIONS), [
            {"id": f"c{i}", "key_id": "k", "created_s": t0 + i * 0.01, "model": "flywheel", "version": i // per_version,
             "prompt_ids": [1, 2, 3, 4], "token_ids": [5, 6, 7, 8], "logprobs": [-0.5] * 4, "versions": [0] * 4,
             "finish_reason": "stop", "text": "abcd", "meta": {}} for i in range(num)])
        c.execute(insert(FEEDBACK), [
            {"id": f"f{i}", "completion_id": f"c{i}", "key_id": "k", "signal": "accept" if rng.random() < 0.4 else
             "reject", "message": "", "diff": "", "created_s": t0 + i * 0.01 + 0.005} for i in range(num)])
    for v in range(10):
        elog.append_event("deploy", v, f"version {v}")
    return elog


def _measure(fn) -> tuple[Any, float, float, float]:
    """(result, seconds, MB held after, peak MB during): timed once, then run again under tracemalloc (which slows
    Python code several times, so it does not run under the clock)."""
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    del out
    tracemalloc.start()
    out = fn()
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, dt, kept / 1e6, peak / 1e6


def run(args: argparse.Namespace) -> dict:
    num = QUICK_NUM if args.quick else NUM
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-dashboard-online-") as tmp:
        path = Path(tmp) / "online.db"
        t = time.perf_counter()
        elog = write_log(path, num)
        write_s = time.perf_counter() - t
        log, first_s, kept_mb, peak_mb = _measure(lambda: OnlineLog(EventLogReader(path)))
        for i in range(NUM_NEW):
            elog.record_completion(CompletionRecord(f"n{i}", "k", "flywheel", 9, [1], [2], [-0.5], [9], "stop", "a"))
            elog.record_feedback(FeedbackRecord(f"m{i}", f"n{i}", "k", "accept"))
        t = time.perf_counter()
        num_read = log.poll()
        poll_ms = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        log.poll()
        empty_ms = (time.perf_counter() - t) * 1e3
        view = log.view()
        assert num_read == 2 * NUM_NEW and view["num_feedback"] == num + NUM_NEW, (num_read, view["num_feedback"])
        rows, base_s, base_kept_mb, base_peak_mb = _measure(lambda: elog.feedback_after(0, limit=num + NUM_NEW))
        assert len(rows) == num + NUM_NEW
        del rows
        size_mb = path.stat().st_size / 1e6
        log.close()
        elog.close()
    summary = {"num_feedback": num, "first_poll_s": round(first_s, 3), "poll_ms": round(poll_ms, 2),
               "empty_poll_ms": round(empty_ms, 3), "kept_mb": round(kept_mb, 2),
               "view_kb": round(len(json.dumps(view)) / 1e3, 1)}
    return {"summary": summary,
            "measured": {**summary, "peak_mb": round(peak_mb, 2), "db_mb": round(size_mb, 1),
                         "write_s": round(write_s, 1), "points": len(view["accept_series"]["rate"]),
                         "accept_rate_all": view["accept_rate_all"]},
            "baseline": {"what": "EventLog.feedback_after(0): every feedback event with its completion, as records",
                         "read_s": round(base_s, 3), "kept_mb": round(base_kept_mb, 1), "peak_mb": round(base_peak_mb, 1)}}
