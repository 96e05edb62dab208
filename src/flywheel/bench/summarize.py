"""Self-summarization benchmark: `flywheel bench summarize --out FILE` (`--quick`: a smoke run of a few minutes).

Three arms on the same held-out long tasks (tasks/synth/long.py, templates never seen in training), every
session of a task seeded alike across arms so that the comparison is paired: (a) summarization off, the session
ends at the window (`model.max_seq_len`); (b) summarization on with the mid-trained policy; (c) summarization on
with the policy after RL on long train tasks with summarization on (`rollout.summary_reward_weight` =
TRAINED_SUMMARY_WEIGHT during that RL, so that summaries earn a signal even where every session of a group fails).
A fourth evaluation, the RL'd policy with summarization off, tells what RL bought apart from summarizing, and
a fifth, the base on as many held-out *easy* tasks (one window each, summarization off), whether the base is a
working policy at all (`pass1_easy_base`).
`summary`: pass1_off, pass1_untrained, pass1_trained with their SEs (over tasks), the paired differences with
theirs, finish_after_summary_rate and tokens_processed_per_session_p50 of the trained arm against max_seq_len.

    flywheel bench summarize --out benchmarks/results/summarize.json [--quick] [--base DIR] [--run-dir DIR]
        [--set midtrain.summary_transcripts=0]      # overrides of every stage (an ablation: another --run-dir)

Config: configs/long.toml (the demo's tiny model, mid-trained on its easy tasks, with a 640-token window).
The mid-trained base is cached in runs/bench-summarize[-quick]/base, or given with `--base DIR` (a model directory
holding its tokenizer, whose context is the config's 640 tokens, e.g. runs/bench-summarize-quick/base/base_model);
the RL run and the evaluations are redone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import threading
import time
from math import sqrt
from pathlib import Path

from flywheel.bench.pipeline import set_overrides
from flywheel.config import FlywheelConfig, load_config
from flywheel.envs.env import CodingEnv
from flywheel.envs.tools import tools_for
from flywheel.inference.registry import build_engine
from flywheel.orchestrator.loop import run_rl
from flywheel.pipeline.midtrain import midtrain
from flywheel.pipeline.prepare import prepare_tasks, prepare_tokenizer, tokenizer_dir
from flywheel.policy.chat import ChatFormat
from flywheel.policy.tokenizer import load_tokenizer
from flywheel.rollout.evaluate import paired_difference, solved
from flywheel.rollout.summary_metrics import summary_metrics
from flywheel.rollout.worker import RolloutWorker
from flywheel.tasks.synth import generate_tasks
from flywheel.tasks.synth.long import generate_long_tasks
from flywheel.trainer import checkpoint as ckpt
from flywheel.types import Task, Trajectory

CONFIG = "configs/long.toml"
KIND, NUM_FILES, PAD_FUNCTIONS = "spread", 2, 1  # ~740 oracle tokens against a 640-token window
NUM_TRAIN = 400
TRAINED_SUMMARY_WEIGHT = 0.2
RL_BUDGET_S, QUICK_RL_BUDGET_S = 900.0, 180.0  # RL is stopped past this (the result says so)
QUICK = ["--midtrain.num_transcripts", "150", "--midtrain.drill_steps", "200", "--midtrain.num_steps", "150",
         "--synth.num_train", "300", "--synth.num_heldout", "10", "--eval.num_tasks", "10", "--trainer.num_steps", "2",
         "--trainer.batch_size", "8"]


def _config(root: Path, quick: bool, extra: list[str] | None = None, overrides: list[str] | None = None
            ) -> FlywheelConfig:
    return load_config(CONFIG, [*(QUICK if quick else []), "--run_dir", str(root), *(overrides or []), *(extra or [])])


async def _sessions(cfg: FlywheelConfig, model_dir: Path, tokenizer, tasks: list[Task], cache_dir: Path
                    ) -> list[list[Trajectory]]:
    """`eval.num_samples` sessions of every task, seeded per task (the same seeds in every arm)."""
    engine = build_engine(cfg, model_dir, tokenizer, log_dir=cache_dir, name="eval")
    await engine.start()
    try:
        rollout = cfg.rollout.model_copy(update={"temperature": cfg.eval.temperature})
        worker = RolloutWorker(engine, ChatFormat(tokenizer, tools_for(cfg.env), cfg.model.tool_format),
                               lambda: CodingEnv(cfg.env, cache_dir, cfg.env.sandbox), rollout)
        return list(await asyncio.gather(*[
            worker.run_group(t, group_size=cfg.eval.num_samples, group_id=f"eval/{t.id}", seed=cfg.seed + i)
            for i, t in enumerate(tasks)]))
    finally:
        await engine.stop()


def _arm(cfg: FlywheelConfig, model_dir: Path, tokenizer, tasks: list[Task], cache_dir: Path) -> dict:
    t0 = time.perf_counter()
    groups = asyncio.run(_sessions(cfg, model_dir, tokenizer, tasks, cache_dir))
    rows: list[dict] = []
    for task, group in zip(tasks, groups):
        ok = [t for t in group if t.env_failure is None]
        rows.append({"task_id": task.id, "n": len(ok), "correct": sum(solved(t) for t in ok)})
    rates = [r["correct"] / r["n"] for r in rows if r["n"]]
    trajs = [t for g in groups for t in g if t.env_failure is None]
    return {"pass1": statistics.fmean(rates) if rates else 0.0,
            "pass1_se": statistics.stdev(rates) / sqrt(len(rates)) if len(rates) > 1 else 0.0,
            "num_tasks": len(rates), "num_sessions": len(trajs),
            "env_failures": sum(len(g) for g in groups) - len(trajs), "wall_s": time.perf_counter() - t0,
            "summarize_at": cfg.rollout.summarize_at, "metrics": summary_metrics(trajs, cfg.model.max_seq_len),
            "per_task": rows}


def _rl(cfg: FlywheelConfig, run_dir: Path, base: Path, tokenizer_dir: Path, tasks: list[Task], budget_s: float):
    """RL with a wall-clock budget: a run whose groups never come back must not hold the bench forever."""
    stop = threading.Event()
    timer = threading.Timer(budget_s, stop.set)
    timer.start()
    try:
        return run_rl(cfg, run_dir, base, tokenizer_dir, tasks, stop_event=stop)
    finally:
        timer.cancel()


def _check_base(base: Path, window: int) -> None:
    if not (base / "config.json").is_file() or not (base / "tokenizer.json").is_file():
        raise SystemExit(f"--base {base}: expected a model directory with config.json and tokenizer.json")
    ctx = json.loads((base / "config.json").read_text())["max_position_embeddings"]
    if ctx != window:
        raise SystemExit(f"--base {base}: its context is {ctx} tokens, the bench's window (model.max_seq_len in "
                         f"{CONFIG}) is {window}; mid-train a base with that window (run without --base)")


def _paired(a: dict, b: dict) -> tuple[float, float]:
    mean, se, _ = paired_difference(a["per_task"], b["per_task"])
    return mean, se


def run(args: argparse.Namespace) -> dict:
    quick = bool(getattr(args, "quick", False))
    root = Path(getattr(args, "run_dir", None) or ("runs/bench-summarize-quick" if quick else "runs/bench-summarize"))
    overrides = set_overrides(getattr(args, "set", None))
    t_start = time.perf_counter()
    cfg = _config(root / "base", quick, overrides=overrides)
    long_train = generate_long_tasks(NUM_TRAIN // (4 if quick else 1), seed=cfg.seed, split="train",
                                     num_files=NUM_FILES, pad_functions=PAD_FUNCTIONS, kind=KIND)
    heldout = generate_long_tasks(cfg.eval.num_tasks, seed=cfg.seed, split="heldout", num_files=NUM_FILES,
                                  pad_functions=PAD_FUNCTIONS, kind=KIND)
    t0 = time.perf_counter()
    if getattr(args, "base", None):
        base = tok_dir = Path(args.base)
        _check_base(base, cfg.model.max_seq_len)
        tokenizer = load_tokenizer(base)
    else:
        easy_train, _ = prepare_tasks(cfg, root / "base")
        tokenizer = prepare_tokenizer(cfg, root / "base", easy_train + long_train)
        base, tok_dir = midtrain(cfg, root / "base", tokenizer, easy_train), tokenizer_dir(cfg, root / "base")
    midtrain_s = time.perf_counter() - t0
    off = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"summarize_at": 0})})
    arms = {"off": _arm(off, base, tokenizer, heldout, root / "cache" / "off"),
            "untrained": _arm(cfg, base, tokenizer, heldout, root / "cache" / "untrained"),
            "easy_base": _arm(off, base, tokenizer, generate_tasks(len(heldout), seed=cfg.seed, split="heldout",
                                                                   difficulty="easy"), root / "cache" / "easy")}
    rl_dir = root / "rl"
    rl_cfg = _config(rl_dir, quick, ["--rollout.summary_reward_weight", str(TRAINED_SUMMARY_WEIGHT)], overrides)
    shutil.rmtree(rl_dir, ignore_errors=True)
    rl = _rl(rl_cfg, rl_dir, base, tok_dir, long_train, QUICK_RL_BUDGET_S if quick else RL_BUDGET_S)
    rl_summary = {k: rl[k] for k in ("steps", "wall_s", "rollouts", "interrupted") if k in rl}
    trained = rl_dir / "final_model"
    last = ckpt.latest_checkpoint(rl_dir / "checkpoints")
    if not (trained / "config.json").exists() and last is not None:  # stopped by its budget: its last step
        trained = ckpt.export_model(base, last, root / "eval" / "trained_model")
    if (trained / "config.json").exists():
        arms["trained"] = _arm(cfg, trained, tokenizer, heldout, root / "cache" / "trained")
        arms["trained_off"] = _arm(off, trained, tokenizer, heldout, root / "cache" / "trained_off")
    summary: dict = {"max_seq_len": cfg.model.max_seq_len, "summarize_at": cfg.rollout.summarize_at,
                     "num_heldout_tasks": len(heldout), "num_samples": cfg.eval.num_samples,
                     "long_tasks": f"{KIND}, {NUM_FILES} files, {PAD_FUNCTIONS} padding functions each",
                     "rl_steps": rl_summary.get("steps"), "rl_interrupted": rl_summary.get("interrupted"),
                     "rl_summary_reward_weight": TRAINED_SUMMARY_WEIGHT}
    for name, arm in arms.items():
        summary[f"pass1_{name}"] = arm["pass1"]
        summary[f"pass1_{name}_se"] = arm["pass1_se"]
    gaps = [("untrained", "off")] + ([("trained", "untrained"), ("trained", "off"), ("trained", "trained_off")]
                                     if "trained" in arms else [])
    for a, b in gaps:
        summary[f"gap_{a}_minus_{b}"], summary[f"gap_{a}_minus_{b}_se"] = _paired(arms[a], arms[b])
    head = arms.get("trained", arms["untrained"])
    summary["arm_of_rates"] = "trained" if "trained" in arms else "untrained"
    for key in ("finish_after_summary_rate", "tokens_processed_per_session_p50", "summaries_per_session",
                "context_full_rate", "pass1_by_summaries"):
        summary[key] = head["metrics"].get(key)
    summary["context_full_rate_off"] = arms["off"]["metrics"].get("context_full_rate")
    summary["wall_s"] = time.perf_counter() - t_start
    summary["midtrain_s"] = midtrain_s  # 0-ish with --base: the base was mid-trained elsewhere
    summary["base_given"] = bool(getattr(args, "base", None))
    return {"config": CONFIG, "quick": quick, "overrides": overrides, "base": str(base), "rl": rl_summary,
            "arms": arms, "summary": summary}
