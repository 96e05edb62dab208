"""The run report: `<run_dir>/report.html`, one self-contained page: the headline figures, plots, transcripts.

    flywheel report runs/demo          # or write_report(run_dir) from code

Reads `metrics.jsonl` (one record per trainer step, see orchestrator/loop.py), `summary.json` and the run's
trajectories; plots are PNGs rendered with matplotlib (Agg) and embedded as base64, so the page can be mailed
around and opened offline. A panel is drawn only when its metrics exist in the run, so the same report serves
every kind of run. The summary is written out in sentences, then one table of every other figure with a label in
words (LABELS, else the key spelled out) and its value formatted (yes/no, units, percentages), not as JSON. A sample of whole GRPO
groups (spread over the run, plus flagged ones) is embedded with the dashboard's own rollout browser
(dashboard/static/rollouts.js, inlined): each transcript with its tool calls, verdict and flags, each group
side by side. The live dashboard (`flywheel dashboard`) browses every transcript.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from flywheel.metrics.dashboard.diff import RunTasks, replay_diff
from flywheel.metrics.dashboard.runindex import RunIndex
from flywheel.metrics.dashboard.transcript import TokenDecoder, group_view, transcript_view
from flywheel.metrics.log import read_metrics

# the flags of envs/reward.py (FLAGS), named here so that the metrics layer does not import the environments
FLAG_NAMES = ("tests_edited", "conftest_added", "sys_exit", "outside_read", "tool_spam", "framework_patch",
              "interpreter_hook", "always_equal", "runner_shadowed", "runner_tampered")
STATIC = Path(__file__).with_name("dashboard") / "static"
NUM_SAMPLE_GROUPS = 8  # groups spread evenly over the run, plus up to 2 with an anti-cheat flag

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


# Human labels of summary.json's keys (the job's, run_rl's and the buffer's); any other key is spelled out from its
# name. A label ending in "?" is a yes/no question.
LABELS = {
    "pass1_pretrained": "held-out pass@1 of the imported model", "midtrain_gain_se": "SE of mid-training's gain",
    "humaneval_before": "HumanEval pass@1 before RL", "humaneval_after": "HumanEval pass@1 after RL",
    "humaneval_change": "HumanEval change", "humaneval_change_se": "SE of the HumanEval change",
    "wall_s": "wall time of the job", "copy_probe_base": "copy probe of the base",
    "exact": "held-out edits copied exactly", "n": "tasks probed",
    "rollouts_tested": "rollouts whose tests ran", "groups_granted": "group starts granted (paced async)",
    "halted": "halted by the anti-cheat monitor?", "interrupted": "stopped early?",
    "buffer/admitted": "rollouts admitted to training", "buffer/groups_seen": "groups received",
    "buffer/groups": "groups trained", "buffer/dropped_uniform": "groups dropped: every reward equal (no signal)",
    "buffer/dropped_stale": "groups dropped: too stale", "buffer/env_failures": "environment failures",
    "buffer/requeued": "groups requeued", "buffer/restored": "groups restored on resume",
    "buffer/lost_groups": "groups lost", "buffer/group_errors": "groups that failed",
    "buffer/engines_added": "engines added", "buffer/engines_removed": "engines removed",
    "buffer/engines_died": "engines that died", "buffer/graded_remote": "graded by the grader service",
    "buffer/graded_fallback": "graded locally (grader fallback)", "buffer/grader_retries": "grader retries",
    "engine/busy": "engine busy", "trainer/busy": "trainer busy", "node/version": "weight version on the nodes",
    "weights/pause_ms": "engine pause per weight update", "weights/apply_ms": "weight fetch + apply",
    "rollout/sessions": "sessions run", "sandbox/failures": "sandbox start failures",
    "sandbox/open": "sandboxes open at the end", "sandbox/leaks": "sandboxes leaked",
}


def label_of(key: str) -> str:
    """A summary key in words: LABELS, else its name with `/` and `_` spelled out (`foo/bar_baz` → foo: bar baz)."""
    if key in LABELS:
        return LABELS[key]
    head, _, tail = key.rpartition("/")
    for suffix in ("_ms", "_s", "_mb"):  # the value carries the unit
        tail = tail.removesuffix(suffix)
    words = tail.replace("_", " ")
    return f"{head.replace('/', ' ')}: {words}" if head else words


def _num(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return html.escape(str(v))
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def value_of(key: str, v) -> str:
    """A summary value for a person: yes/no, – for nothing, units from the key (_s, _ms, _mb), busy as a percent,
    counts with thousands separators, other numbers to 4 significant digits."""
    if v is None:
        return "no" if LABELS.get(key, "").endswith("?") else "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, dict) and key == "halted":
        return html.escape(f"yes: flag {v.get('flag')} in {100 * float(v.get('rate', 0)):.1f} % of the last "
                           f"{v.get('window')} sessions")
    if isinstance(v, list):
        return ", ".join(value_of("", x) for x in v) or "–"
    if not isinstance(v, (int, float)):
        return html.escape(str(v))
    if key.endswith("busy") and 0 <= v <= 1:
        return f"{100 * v:.1f} %"
    unit = next((u for suffix, u in (("_ms", " ms"), ("_s", " s"), ("_mb", " MB")) if key.endswith(suffix)), "")
    if float(v).is_integer() and not unit:
        return f"{int(v):,}"
    return f"{v:.4g}{unit}"


def _rows(d: dict, prefix: str = "") -> list[str]:
    rows = []
    for k, v in d.items():
        label = f"{prefix}{label_of(str(k)).rstrip('?')}"
        if isinstance(v, dict) and v and k != "halted":
            rows += _rows(v, f"{label} › ")
        else:
            rows.append(f"<tr><th>{html.escape(label)}</th><td>{value_of(str(k), v)}</td></tr>")
    return rows


def _table(d: dict) -> str:
    """Every figure as a row of a two-column table: its label in words, its value formatted (nested dicts become
    `section › figure` rows)."""
    return "<table class='summary'>" + "".join(_rows(d)) + "</table>"


def summary_html(summary: dict) -> str:
    """The run's headline in sentences; every other figure of summary.json in plain tables."""
    s = dict(summary)
    lines = []
    if "pass1_before" in s:
        line = f"Held-out pass@1 went from <b>{_num(s.pop('pass1_before'))}</b>"
        if "pass1_after" in s:
            line += f" before RL to <b>{_num(s.pop('pass1_after'))}</b> after"
            if "pass1_gain" in s:
                line += f": a gain of {_num(s.pop('pass1_gain'))}"
                if "pass1_gain_se" in s:
                    line += f" ± {_num(s.pop('pass1_gain_se'))} (standard error, paired over held-out tasks)"
        else:
            line += " before RL (no evaluation after it yet)"
        lines.append(line + ".")
    rl = s.pop("rl", None)
    if isinstance(rl, dict):
        line = f"RL ran {rl.get('steps', '?')} trainer steps in {_num(rl.get('wall_s', 0.0))} s"
        if "trainer_busy" in rl:
            line += f"; the trainer was busy {_num(100 * rl['trainer_busy'])} % of that time"
        if "rollouts" in rl:
            line += f"; {rl['rollouts']} rollouts in {rl.get('groups_received', '?')} groups"
        if rl.get("staleness_hist"):
            hist = ", ".join(f"{n} at {k}" for k, n in sorted(rl["staleness_hist"].items(), key=lambda kv: int(kv[0])))
            line += f"; trained groups by staleness (versions behind): {hist}"
        lines.append(line + (" (stopped early; resume with --resume)." if rl.get("interrupted") else "."))
        rest = {k: v for k, v in rl.items() if k not in ("steps", "wall_s", "trainer_busy", "rollouts",
                                                         "groups_received", "staleness_hist", "interrupted")}
        if rest:
            s.update(rest)  # the loop's other figures: one table with the job's
    timings = s.pop("timings_s", None)
    if isinstance(timings, dict) and timings:
        lines.append("Wall time by stage: " + ", ".join(f"{html.escape(k)} {_num(v)} s" for k, v in timings.items()) + ".")
    out = "".join(f"<p>{line}</p>" for line in lines)
    return out + (_table(s) if s else "")


def _sample_groups(run: RunIndex) -> list[str]:
    groups = list(run.trajectories.groups)
    if not groups:
        return []
    n = min(NUM_SAMPLE_GROUPS, len(groups))
    picked = [groups[round(i * (len(groups) - 1) / max(1, n - 1))] for i in range(n)]
    flagged = [g for g in groups if g not in picked and
               any(run.trajectories.rows[i]["flags"] for i in run.trajectories.groups[g])]
    return list(dict.fromkeys(picked + flagged[:2]))


def rollouts_html(run_dir: Path) -> str:
    """The sample of transcripts with the rollout browser's script, or a line saying there are none."""
    run = RunIndex(run_dir)
    gids = _sample_groups(run)
    if not gids:
        return "<p>This run recorded no trajectories.</p>"
    decoder = TokenDecoder.for_run(run.path, run.config)
    tasks = RunTasks(run.path, run.config)
    rows, views, groups = [], {}, {}
    for gid in gids:
        members = []
        for i in run.trajectories.groups[gid]:
            traj = run.trajectories.load(i)
            view = transcript_view(traj, decoder)
            for seg in view["segments"]:  # per-token data stays in the live dashboard: keeps this file small
                for turn in seg["turns"]:
                    turn.pop("tokens", None)
            diff = replay_diff(tasks.get(traj.task_id), view) if view["diff"] is None else {"diff": view["diff"]}
            views[i] = {"id": i, **view, "diff": diff["diff"], "diff_note": diff.get("note", "")}
            rows.append(run.trajectories.rows[i])
            members.append((i, traj))
        groups[gid] = {"group": gid, "members": group_view(members, decoder)}
    data = json.dumps({"rows": rows, "views": views, "groups": groups}).replace("</", "<\\/")
    script = (STATIC / "rollouts.js").read_text()
    return (f"<p>{len(rows)} of the run's {len(run.trajectories.rows)} rollouts: {len(gids)} whole groups spread "
            "over the run (and flagged ones). Click a row to read it, or “side by side” for its group.</p>"
            "<div id='rollout-split'><div id='rollout-list'></div><div id='rollout-detail'></div></div>"
            f"<script>{script}</script><script id='rollout-data' type='application/json'>{data}</script>"
            "<script>const D = JSON.parse(document.getElementById('rollout-data').textContent);"
            "const detail = document.getElementById('rollout-detail');"
            "document.getElementById('rollout-list').appendChild(FlywheelRollouts.listTable(D.rows,"
            " (id) => FlywheelRollouts.transcript(detail, D.views[id]),"
            " (g) => FlywheelRollouts.group(detail, D.groups[g])));</script>")


def write_report(run_dir: str | Path) -> Path:
    run = Path(run_dir)
    records = read_metrics(run / "metrics.jsonl")
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    parts = [f"<html><head><meta charset='utf-8'><title>flywheel run {html.escape(run.name)}</title>",
             f"<style>{(STATIC / 'style.css').read_text()}\n"
             "body{margin:2em;max-width:1400px} img{margin:4px;border:1px solid #ddd}</style>",
             f"</head><body><h1>flywheel run: {html.escape(run.name)}</h1>"]
    if summary:
        parts.append("<h2>Summary</h2>" + summary_html(summary))
    parts.append(f"<h2>Over training ({len(records)} records)</h2>")
    for title, keys, ylabel in PANELS:
        png = _plot(records, keys, title, ylabel)
        if png:
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    parts.append("<h2>Rollouts</h2>" + rollouts_html(run))
    parts.append("</body></html>")
    out = run / "report.html"
    out.write_text("\n".join(parts))
    return out
