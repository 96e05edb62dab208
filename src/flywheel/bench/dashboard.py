"""Benchmark: the dashboard over a run with 10,000 transcripts — first paint, opening a transcript, server memory.

    flywheel bench dashboard --out benchmarks/results/dashboard.json [--quick]

The run directory is written by flywheel's own writers (AdmittedLog, MetricsLog, save_config): 40 groups of
scripted-policy sessions run through the real harness, sandbox and grader (pipeline/scripted.py), then copied with
new group ids, weight versions and sampler log-probs until there are 10,000 trajectories (2,000 with --quick),
with one metrics record per 20 of them. `flywheel dashboard` runs in a child process; Debian's chromium, driven
by Playwright, loads the page.

`summary`: first_paint_ms (navigation start → the page shows its data: the overview's tiles and charts, or the
rollout browser's first 200 rows; the slower view's median over 3 fresh loads each, after one load that warms
the new browser, reported as first_paint_ms_cold_browser; the overview draws its first 8 charts before it counts
as shown and the rest in batches after, until all_charts_drawn_ms), transcript_open_ms_p50/p95 (a click's fetch
and render, 30 random transcripts), server_rss_mb (resident memory after all of that), index_s (server start
until it answers, indexing included).
Baseline in the same run: the same index built by parsing every line in full (`full_parse_index_s`), and the
bytes of trajectories on disk, which a server that loaded every transcript would hold at least.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from flywheel.config import EnvConfig, load_config, save_config
from flywheel.envs.tools import tools_for
from flywheel.metrics.dashboard.browser import DashboardProcess, launch_chromium
from flywheel.metrics.dashboard.runindex import TrajectoryFiles, full_summaries
from flywheel.metrics.log import MetricsLog
from flywheel.orchestrator.loop import AdmittedLog, batch_metrics, received_metrics
from flywheel.pipeline.scripted import scripted_group
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import default_corpus, save_tokenizer, train_tokenizer
from flywheel.tasks.synth import generate_tasks
from flywheel.types import Trajectory

NUM, QUICK_NUM = 10_000, 2_000
PER_STEP = 20  # trajectories per metrics record (a batch of 4 groups of 5)
TARGETS = {"first_paint_ms": 1000, "transcript_open_ms_p50": 200}
# trainer-side keys a real run logs (orchestrator/loop.py, trainer/train.py), drawn as slow random walks here
TRAINER_KEYS = ["loss", "pg_loss", "kl", "clip_frac", "ratio_mean", "grad_norm", "lr", "advantage_abs_mean",
                "is_weight_mean", "is_clip_frac", "mismatch/k1", "mismatch/k3", "mismatch/max_abs_diff",
                "mismatch/mean_abs_diff", "mismatch/frac_outside_0.5_2", "tokens_per_s", "step_time_s",
                "trainer/busy", "engine/busy", "weights/bytes_mb", "weights/ratio", "weights/encode_ms",
                "weights/apply_ms", "weights/pause_ms", "weights/changed_fraction", "throughput/rollouts_per_s",
                "throughput/tokens_per_s_k", "buffer/admitted", "buffer/env_failures", "time/elapsed_s"]


def _variant(traj: Trajectory, group_id: str, version: int, rng: random.Random) -> Trajectory:
    """A copy of a graded session as if sampled at `version`, with its own sampler log-probs."""
    t = copy.deepcopy(traj)
    t.group_id = group_id
    for seg in t.segments:
        seg.versions = [version if m else -1 for m in seg.loss_mask]
        seg.logprobs = [round(-min(12.0, rng.expovariate(2.5)), 6) if m else 0.0 for m in seg.loss_mask]
    t.timings = {k: v * rng.uniform(0.7, 1.5) for k, v in t.timings.items()}
    return t


def write_run(run_dir: Path, num: int, seed: int = 0) -> dict:
    """A run directory with `num` trajectories and one metrics record per PER_STEP of them."""
    rng = random.Random(seed)
    env = EnvConfig(sandbox="local", tools="core")
    tok = train_tokenizer(default_corpus(200_000), 512)
    save_tokenizer(tok, run_dir / "tokenizer")
    cfg = load_config(None, ["--run_dir", str(run_dir), "--env.tools", "core", "--env.sandbox", "local",
                             "--rollout.group_size", "5", "--trainer.batch_size", str(PER_STEP),
                             "--trainer.num_steps", str(num // PER_STEP)])
    save_config(cfg, run_dir)
    chat = ChatFormat(tok, tools_for(env), cfg.model.tool_format)
    tasks = generate_tasks(40, seed=seed, split="train", difficulty="easy")
    t0 = time.monotonic()
    templates = [scripted_group(chat, task, env, run_dir / "cache", version=0, seed=i) for i, task in enumerate(tasks)]
    sessions_s = time.monotonic() - t0
    admitted = AdmittedLog(run_dir / "trajectories" / "admitted.jsonl")
    log = MetricsLog(run_dir)
    walk = {k: rng.uniform(0.1, 1.0) for k in TRAINER_KEYS}
    batch: list[Trajectory] = []
    groups: list[list[Trajectory]] = []
    step = 0
    for g in range(num // 5):
        version = step
        group = [_variant(t, f"n{g % 2}/g{g}/{t.task_id}", version, rng) for t in templates[g % len(templates)]]
        admitted.append(group)
        groups.append(group)
        batch += group
        if len(batch) >= PER_STEP:
            step += 1
            for k in walk:
                walk[k] = max(0.0, walk[k] * rng.uniform(0.95, 1.05))
            log.write({"step": step, **walk, **batch_metrics(batch), **received_metrics(groups),
                       "staleness/mean": rng.uniform(0, 2), "staleness/max": rng.randint(0, 4)})
            batch, groups = [], []
    admitted.close()
    log.close()
    return {"num_trajectories": admitted.count * 5, "num_steps": step, "template_sessions_s": round(sessions_s, 2),
            "trajectories_mb": round((run_dir / "trajectories" / "admitted.jsonl").stat().st_size / 2**20, 1)}


def _rss_mb(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            fields[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return {"rss_mb": fields.get("VmRSS"), "peak_rss_mb": fields.get("VmHWM")}


def measure(root: Path, run: str, num_open: int = 30, seed: int = 0) -> dict:
    """Start the server, load the page in Chromium, open transcripts; the figures of `summary`."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise SystemExit("flywheel bench dashboard needs playwright (pip install -e '.[dev]') and Debian's "
                         "chromium (apt-get install chromium)") from err
    t0 = time.monotonic()
    with DashboardProcess(root) as server:
        index_s = time.monotonic() - t0
        rss_indexed = _rss_mb(server.proc.pid)
        total = server.get(f"api/run/{run}/rollouts?limit=1")["total"]
        with sync_playwright() as pw:
            context, profile = launch_chromium(pw)
            paints: dict[str, list[float]] = {"overview": [], "rollouts": []}
            charts_done: list[float] = []
            for view in ["overview", "rollouts"] * 4:  # the first load warms a new browser: reported apart
                page = context.new_page()
                page.goto(f"{server.url}#run={run}&view={view}")
                page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                shown = ".chart canvas" if view == "overview" else "tr.rollout-row"
                assert page.locator(shown).count() >= (10 if view == "overview" else 200), f"{view} shows no data"
                paints[view].append(page.evaluate("window.flywheelReadyMs"))
                if view == "overview":
                    page.wait_for_selector("body[data-charts='done']", timeout=60_000)
                    charts_done.append(page.evaluate("window.flywheelChartsDoneMs"))
                page.close()
            page = context.new_page()
            page.goto(f"{server.url}#run={run}&view=rollouts")
            page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            rng = random.Random(seed)
            opens = []
            for traj_id in rng.sample(range(total), num_open):
                opens.append(page.evaluate("""async id => {
                    const t0 = performance.now();
                    await openRollout(id);
                    if (!document.querySelector(`.transcript[data-id="${id}"]`)) throw new Error('not shown');
                    return performance.now() - t0; }""", traj_id))
            context.close()
        rss = _rss_mb(server.proc.pid)
    opens.sort()
    cold = paints["overview"].pop(0)
    medians = {v: statistics.median(p) for v, p in paints.items()}
    return {"index_s": round(index_s, 2), "first_paint_ms_runs": {v: [round(x, 1) for x in p] for v, p in paints.items()},
            "first_paint_ms_cold_browser": round(cold, 1), "first_paint_ms_by_view": {v: round(m, 1) for v, m in medians.items()},
            "first_paint_ms": round(max(medians.values()), 1),
            "all_charts_drawn_ms": round(statistics.median(charts_done[1:]), 1),
            "transcript_open_ms_p50": round(statistics.median(opens), 1),
            "transcript_open_ms_p95": round(opens[int(0.95 * (len(opens) - 1))], 1),
            "server_rss_mb": rss["rss_mb"], "server_peak_rss_mb": rss["peak_rss_mb"],
            "server_rss_mb_after_index": rss_indexed["rss_mb"], "num_transcripts": total}


def baseline(run_dir: Path) -> dict:
    """The same summaries from a full parse of every line, beside the fast path, in this process."""
    path = run_dir / "trajectories" / "admitted.jsonl"
    t0 = time.monotonic()
    with path.open("rb") as f:
        n_full = sum(len(full_summaries(line)) for line in f)
    full_s = time.monotonic() - t0
    t0 = time.monotonic()
    files = TrajectoryFiles(path.parent)
    n_fast = files.poll()
    fast_s = time.monotonic() - t0
    assert n_full == n_fast
    return {"full_parse_index_s": round(full_s, 2), "fast_index_s": round(fast_s, 2),
            "trajectories_on_disk_mb": round(path.stat().st_size / 2**20, 1)}


def run(args: argparse.Namespace) -> dict:
    num = QUICK_NUM if args.quick else NUM
    load_avg = [round(x, 2) for x in os.getloadavg()]  # the machine may be shared: say how busy it was
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-dashboard-") as tmp:
        root = Path(tmp) / "runs"
        t0 = time.monotonic()
        written = write_run(root / "bench", num)
        written["write_s"] = round(time.monotonic() - t0, 1)
        figures = measure(root, "bench")
        base = baseline(root / "bench")
    summary = {k: figures[k] for k in ("first_paint_ms", "transcript_open_ms_p50", "server_rss_mb", "num_transcripts")}
    summary["targets_met"] = all(summary[k] <= v for k, v in TARGETS.items())
    return {"summary": summary, "targets": TARGETS, "measured": figures, "baseline": base, "run": written,
            "load_avg_at_start": load_avg}  # commit, date and command: `provenance`, written by `flywheel bench`
