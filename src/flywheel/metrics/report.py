"""The run report: `<run_dir>/report.html`, one self-contained page of plots and the headline figures.

    flywheel report runs/demo          # or write_report(run_dir) from code

Reads `metrics.jsonl` (one record per trainer step, see orchestrator/loop.py) and `summary.json`;
plots are PNGs rendered with matplotlib (Agg) and embedded as base64, so the page can be mailed around.
A panel is drawn only when its metrics exist in the run, so the same report serves every kind of run.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from flywheel.metrics.log import read_metrics

# the flags of envs/reward.py (FLAGS), named here so that the metrics layer does not import the environments
FLAG_NAMES = ("tests_edited", "conftest_added", "sys_exit", "outside_read", "tool_spam", "framework_patch",
              "interpreter_hook", "always_equal", "runner_shadowed", "runner_tampered")

# (title, [(metric key, label)], y label)
PANELS: list[tuple[str, list[tuple[str, str]], str]] = [
    ("Reward and pass rate", [("rollout/reward_all", "mean reward, all rollouts"),
                              ("rollout/pass_rate_all", "pass rate, all rollouts"),
                              ("reward/mean", "mean reward, trained groups")], "fraction"),
    ("Loss", [("loss", "total loss"), ("pg_loss", "policy-gradient loss"), ("kl", "KL to reference")], ""),
    ("Staleness of trained groups", [("staleness/mean", "mean"), ("staleness/max", "max")], "trainer versions"),
    ("Throughput", [("throughput/rollouts_per_s", "rollouts/s"), ("throughput/tokens_per_s_k", "k tokens/s")], "per second"),
    ("Busy fraction", [("trainer/busy", "trainer"), ("engine/busy", "engine")], "fraction of wall time"),
    ("Weight sync: bytes per version", [("weights/bytes_mb", "published MB"), ("weights/ratio", "ratio to full bf16")], ""),
    ("Weight sync: engine pause", [("weights/pause_ms", "pause ms"), ("weights/apply_ms", "fetch+apply ms")], "ms"),
    ("Train–inference mismatch", [("mismatch/k3", "k3 KL"), ("mismatch/max_abs_diff", "max |Δ log p|"),
                                  ("mismatch/frac_outside_0.5_2", "frac ratio ∉ [0.5, 2]"),
                                  ("router_agreement", "MoE expert agreement")], ""),
    ("Anti-cheat flags", [("flags/total", "flags per batch")], "count"),
    ("Anti-cheat flag rates (sliding window)",
     [(f"flags/window_rate/{f}", f) for f in FLAG_NAMES], "fraction of sessions"),
]


def _plot(records: list[dict], keys: list[tuple[str, str]], title: str, ylabel: str) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = []
    for key, label in keys:
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
        if pts:
            series.append((label, pts))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.2), dpi=100)
    for label, pts in series:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("trainer step")
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_report(run_dir: str | Path) -> Path:
    run = Path(run_dir)
    records = read_metrics(run / "metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    parts = [f"<html><head><meta charset='utf-8'><title>flywheel run {html.escape(run.name)}</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:1200px} img{margin:4px;border:1px solid #ddd}"
             " table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}</style>",
             f"</head><body><h1>flywheel run: {html.escape(run.name)}</h1>"]
    if summary:
        parts.append("<h2>Summary</h2><table>")
        for k, v in summary.items():
            shown = f"{v:.4g}" if isinstance(v, float) else html.escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v))
            parts.append(f"<tr><th>{html.escape(k)}</th><td>{shown}</td></tr>")
        parts.append("</table>")
    parts.append(f"<h2>Over training ({len(records)} records)</h2>")
    for title, keys, ylabel in PANELS:
        png = _plot(records, keys, title, ylabel)
        if png:
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("</body></html>")
    out = run / "report.html"
    out.write_text("\n".join(parts))
    return out
