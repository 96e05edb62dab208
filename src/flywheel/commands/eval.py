"""Evaluate a policy: pass@1 and pass@k over a task file, per-task results as JSONL.

    flywheel eval --tasks runs/demo/tasks/heldout.jsonl --model runs/demo/final_model --samples 4 --out eval.jsonl
    flywheel eval configs/demo.toml --tasks heldout.jsonl --model HuggingFaceTB/SmolLM2-135M-Instruct  # HF cache

CONFIG (optional) sets the env and rollout settings; `--section.key VALUE` overrides any of them. The model
directory must hold config.json, the weights and the tokenizer (or pass --tokenizer); a Hub id is used only when
it is already in the local Hugging Face cache. A task file with broken lines is refused (they are listed, and
`flywheel tasks check FILE` explains each) unless --skip-broken.
"""

from __future__ import annotations

import argparse

HELP = "pass@1 / pass@k of a model directory over a task file"
ACCEPTS_OVERRIDES = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None, help="config file for env/rollout settings (default: the "
                   "built-in defaults)")
    p.add_argument("--config", dest="config_opt", default=None, help=argparse.SUPPRESS)  # the older spelling
    p.add_argument("--tasks", required=True, help="task file (flywheel, SWE-bench or HumanEval JSONL)")
    p.add_argument("--model", required=True, help="model directory (with its tokenizer), or a Hub id in the local "
                   "HF cache")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model directory)")
    p.add_argument("--samples", type=int, default=1, help="sessions per task (pass@k for k = 1 and this)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: eval.temperature)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N tasks")
    p.add_argument("--skip-broken", action="store_true", help="evaluate the usable tasks of a file with broken lines")
    p.add_argument("--out", default="eval.jsonl", help="per-task results (JSONL)")


def run(args: argparse.Namespace) -> int:
    import sys
    import tempfile
    from pathlib import Path

    from flywheel.config import UserError, load_config
    from flywheel.pipeline.evaluation import evaluate_model
    from flywheel.pipeline.job import Progress
    from flywheel.policy.model_dir import check_tokenizer_dir, resolve_model_dir
    from flywheel.tasks.loaders import load_tasks

    if args.samples < 1 or args.limit < 0:
        raise UserError("--samples must be at least 1 and --limit at least 0 (0: every task)")
    overrides = list(args.overrides) + ["--eval.num_samples", str(args.samples)]
    if args.temperature is not None:
        overrides += ["--eval.temperature", str(args.temperature)]
    cfg = load_config(args.config or args.config_opt, overrides)
    loaded = load_tasks(args.tasks)
    if not args.skip_broken:
        loaded.refuse_broken(args.tasks, "evaluate")
    if loaded.errors:
        print(f"flywheel eval: skipping {len(loaded.errors)} broken task(s): {loaded.broken_summary()}", file=sys.stderr)
    tasks = loaded.tasks[: args.limit or None]
    if not tasks:
        raise UserError(f"no usable task in '{args.tasks}'")
    model_dir = resolve_model_dir(args.model)
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        raise UserError(f"--tokenizer {args.tokenizer}: no such directory; pass the directory that holds the "
                        f"tokenizer.json the model was trained with")
    tokenizer = check_tokenizer_dir(Path(args.tokenizer) if args.tokenizer else model_dir,
                                    option="--tokenizer" if args.tokenizer else "--model")
    with Progress() as progress, tempfile.TemporaryDirectory(prefix="flywheel-eval-") as cache:
        rows: list[dict] = []

        def done(row: dict) -> None:
            rows.append(row)
            progress.update("eval", len(rows), len(tasks), f"solved {sum(r['correct'] > 0 for r in rows)}")

        res = evaluate_model(cfg, model_dir, tokenizer, tasks, Path(cache), Path(args.out), done)
    for k, v in sorted(res.pass_at.items()):
        print(f"pass@{k}: {v:.4f}")
    print(f"env failures: {res.num_env_failures}; per-task results: {args.out}")
    return 0
