"""Evaluate a policy: pass@1 and pass@k over a task file, per-task results as JSONL.

    flywheel eval --tasks heldout.jsonl --model runs/demo/final_model --samples 4 --out eval.jsonl
"""

from __future__ import annotations

import argparse

HELP = "pass@1 / pass@k of a model directory over a task file"
ACCEPTS_OVERRIDES = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", required=True, help="task file (flywheel, SWE-bench or HumanEval JSONL)")
    p.add_argument("--model", required=True, help="local HF model directory (with its tokenizer)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    p.add_argument("--config", default=None, help="config file for env/rollout settings")
    p.add_argument("--samples", type=int, default=1, help="sessions per task (pass@k for k = 1 and this)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: eval.temperature)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N tasks")
    p.add_argument("--out", default="eval.jsonl", help="per-task results (JSONL)")


def run(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from flywheel.config import load_config
    from flywheel.pipeline.evaluation import evaluate_model
    from flywheel.pipeline.job import Progress
    from flywheel.policy.tokenizer import load_tokenizer
    from flywheel.tasks.loaders import load_tasks

    overrides = list(args.overrides) + ["--eval.num_samples", str(args.samples)]
    if args.temperature is not None:
        overrides += ["--eval.temperature", str(args.temperature)]
    cfg = load_config(args.config, overrides)
    loaded = load_tasks(args.tasks)
    for err in loaded.errors:
        print(f"skipping task {err.task_id or '?'} (line {err.line}): {err.reason}")
    tasks = loaded.tasks[: args.limit or None]
    if not tasks:
        raise SystemExit(f"flywheel eval: no usable task in '{args.tasks}'")
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    with Progress() as progress, tempfile.TemporaryDirectory(prefix="flywheel-eval-") as cache:
        rows: list[dict] = []

        def done(row: dict) -> None:
            rows.append(row)
            progress.update("eval", len(rows), len(tasks), f"solved {sum(r['correct'] > 0 for r in rows)}")

        res = evaluate_model(cfg, Path(args.model), tokenizer, tasks, Path(cache), Path(args.out), done)
    for k, v in sorted(res.pass_at.items()):
        print(f"pass@{k}: {v:.4f}")
    print(f"env failures: {res.num_env_failures}; per-task results: {args.out}")
    return 0
