"""pass@k of a policy on mined real-code tasks, with how every session ended and which tool calls failed.

    .venv/bin/python benchmarks/mined_passk.py configs/real.toml --tasks runs/mined-real/easiest.jsonl \
        --model runs/real/final_model --tokenizer runs/real/base_model --samples 16 \
        --out-dir runs/mined-real/final --env.python_envs_dir runs/mined-real/envs

It is `flywheel eval` (the same engine, rollout worker, grader and `evaluate`, so pass@1 / pass@k and the
per-task rows are the same figures) plus what `flywheel eval` does not keep: every session's tool calls with
their result (the parser's error kind, or the harness's error message), how the session ended, and the text the
model wrote. Why a script: the answer to "can RL learn here" is the count of tasks with 0 < pass rate < 1, and
when there are none, the reason is in the tool calls; `flywheel eval` writes only the per-task rows.

Writes OUT_DIR/eval.jsonl (flywheel eval's per-task rows), OUT_DIR/sessions.jsonl (one line per session) and
OUT_DIR/summary.json (pass@k, tasks with a success, session ends, tool-call outcomes, counts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from flywheel.config import load_config
from flywheel.envs.env import CodingEnv
from flywheel.pipeline.evaluation import run_evaluation
from flywheel.policy.model_dir import check_tokenizer_dir
from flywheel.rollout.worker import RolloutWorker
from flywheel.tasks.loaders import load_tasks

# the session whose env is running in this task / thread (asyncio.to_thread copies the context)
_RECORD: contextvars.ContextVar[dict] = contextvars.ContextVar("record")

# harness error messages (envs/tools.py) -> a short outcome name
HARNESS_ERRORS = [
    (r"^Error: unknown tool", "unknown_tool"),
    (r"^Error: \w+: (arguments must be|unknown argument|missing argument|argument ')", "bad_arguments"),
    (r"^Error: no such file", "no_such_file"),
    (r"old text not found", "edit_not_applied:old_not_found"),
    (r"old text occurs \d+ times", "edit_not_applied:ambiguous"),
    (r"old must not be empty", "edit_not_applied:empty_old"),
    (r"out of range|is before start", "view_bad_range"),
    (r"is not a text file|is not a regular file|files over", "view_not_a_file"),
    (r"already submitted", "after_submit"),
    (r"path must be a non-empty string|outside", "bad_path"),
]


def classify(text: str) -> str:
    for pattern, name in HARNESS_ERRORS:
        if re.search(pattern, text):
            return name
    return "other_error"


class RecordingEnv(CodingEnv):
    """CodingEnv that writes each tool call and its outcome into the current session's record."""

    def reset(self, task):
        rec = _RECORD.get()
        rec["steps"], rec["num_env_steps"] = [], 0  # a retried session starts over
        return super().reset(task)

    def step(self, tool_calls, errors=()):
        assert self.harness is not None
        rec = _RECORD.get()
        n_log = len(self.harness.log)
        obs, done = super().step(tool_calls, errors)
        rec["num_env_steps"] += 1
        calls = []
        for err in errors:
            calls.append({"tool": "<parse>", "outcome": err.kind, "message": err.message[:200], "raw": err.raw[:300]})
        for call, entry, msg in zip(tool_calls, self.harness.log[n_log + len(errors):], obs[len(errors):]):
            args = call.arguments if isinstance(call.arguments, dict) else {}
            item = {"tool": entry["name"], "args": {k: (v[:120] if isinstance(v, str) else v) for k, v in args.items()}}
            if entry.get("is_error"):
                item["outcome"], item["message"] = classify(msg.content), msg.content[:200]
            elif entry["name"] == "run_tests" and msg.content.startswith("This task has no visible tests"):
                item["outcome"] = "no_visible_tests"
            else:
                item["outcome"] = "ok"
            calls.append(item)
        rec["steps"].append(calls)
        return obs, done


class RecordingWorker(RolloutWorker):
    """RolloutWorker that keeps every session's trajectory with its env record."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sessions: list[tuple[object, dict]] = []

    async def run_one(self, task, group_id, seed):
        rec: dict = {"steps": [], "num_env_steps": 0}
        _RECORD.set(rec)
        traj = await super().run_one(task, group_id, seed)
        self.sessions.append((traj, rec))
        return traj


def sampled_texts(traj, tokenizer) -> list[str]:
    """The model's turns: each run of loss-mask-1 tokens, decoded."""
    out = []
    for seg in traj.segments:
        run: list[int] = []
        for tok, m in zip(seg.token_ids + [None], seg.loss_mask + [0]):
            if m:
                run.append(tok)
            elif run:
                out.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
    return out


def session_end(traj, rec: dict, max_turns: int, max_total_tokens: int, max_seq_len: int) -> str:
    if traj.env_failure is not None:
        return "env_failure"
    if traj.meta.get("submitted"):
        return "submitted"
    if rec["num_env_steps"] < traj.num_turns:
        return "answered_without_tool_call"  # the last turn had no tool call: the session ends there
    if traj.num_turns >= max_turns:
        return "turn_limit"
    if traj.meta.get("num_sampled_tokens", 0) >= max_total_tokens:
        return "token_budget"
    if traj.segments and len(traj.segments[-1].token_ids) >= max_seq_len - 64:
        return "context_full"
    return "wall_clock"


def run(cfg, model_dir: Path, tokenizer, tasks, cache: Path):
    done: list[dict] = []

    def progress(row: dict) -> None:
        done.append(row)
        print(f"[{time.strftime('%H:%M:%S')}] {len(done)}/{len(tasks)} {row['task_id']}: "
              f"{row['correct']}/{row['n']} solved", flush=True)

    res, worker = asyncio.run(run_evaluation(cfg, model_dir, tokenizer, tasks, cache, progress,
                                             worker_cls=RecordingWorker, env_cls=RecordingEnv))
    return res, worker.sessions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--tasks", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--out-dir", required=True)
    args, overrides = p.parse_known_args(argv)
    cfg = load_config(args.config, overrides + ["--eval.num_samples", str(args.samples),
                                                "--eval.temperature", str(args.temperature)])
    tasks = load_tasks(args.tasks).tasks[: args.limit or None]
    by_id = {t.id: t for t in tasks}
    tokenizer = check_tokenizer_dir(Path(args.tokenizer or args.model))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="flywheel-minedpassk-") as cache:
        res, sessions = run(cfg, Path(args.model), tokenizer, tasks, Path(cache))
    wall_s = time.time() - t0
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in res.per_task))

    ends, outcomes, tools, per_call = Counter(), Counter(), Counter(), Counter()
    viewed_bug_file = edited_bug_file = 0
    lines = []
    for traj, rec in sessions:
        task = by_id[traj.task_id]
        end = session_end(traj, rec, task.limits.max_turns or cfg.rollout.max_turns, cfg.rollout.max_total_tokens,
                          cfg.model.max_seq_len)
        ends[end] += 1
        calls = [c for step in rec["steps"] for c in step]
        for c in calls:
            outcomes[c["outcome"]] += 1
            tools[c["tool"]] += 1
            per_call[f"{c['tool']}:{c['outcome']}"] += 1
        bug_path = task.meta.get("path", "")
        v = any(c["tool"] == "view" and c.get("args", {}).get("path", "").lstrip("./") == bug_path for c in calls)
        e = any(c["tool"] == "str_replace" and c["outcome"] == "ok" and
                c.get("args", {}).get("path", "").lstrip("./") == bug_path for c in calls)
        viewed_bug_file += v
        edited_bug_file += e
        r = traj.reward
        lines.append({"task_id": traj.task_id, "end": end, "reward": None if r is None else r.value,
                      "components": None if r is None else r.components, "num_turns": traj.num_turns,
                      "num_tool_calls": traj.num_tool_calls, "num_tool_errors": traj.num_tool_errors,
                      "num_sampled_tokens": traj.meta.get("num_sampled_tokens"),
                      "context_tokens": len(traj.segments[-1].token_ids) if traj.segments else 0,
                      "viewed_bug_file": v, "edited_bug_file": e, "steps": rec["steps"],
                      "texts": [t[:1500] for t in sampled_texts(traj, tokenizer)]})
    (out / "sessions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rates = [r["correct"] / r["n"] for r in res.per_task if r["n"]]
    summary = {
        "model": args.model, "tasks": args.tasks, "num_tasks": len(tasks), "samples_per_task": args.samples,
        "temperature": args.temperature, "pass_at": {str(k): round(v, 4) for k, v in res.pass_at.items()},
        "mean_reward": round(res.mean_reward, 4), "num_sessions": len(sessions),
        "num_env_failures": res.num_env_failures,
        "num_tasks_with_a_success": sum(r["correct"] > 0 for r in res.per_task),
        "num_tasks_with_signal": sum(0 < x < 1 for x in rates),
        "num_sessions_solved": sum(r["correct"] for r in res.per_task),
        "session_ends": dict(ends.most_common()), "tool_calls_by_tool": dict(tools.most_common()),
        "tool_call_outcomes": dict(outcomes.most_common()), "tool_call_outcomes_by_tool": dict(per_call.most_common()),
        "num_tool_calls": sum(tools.values()), "sessions_viewing_the_bugged_file": viewed_bug_file,
        "sessions_editing_the_bugged_file": edited_bug_file, "wall_s": round(wall_s, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
