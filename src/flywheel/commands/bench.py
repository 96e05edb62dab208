"""Run a benchmark and write its JSON: `flywheel bench <target> --out FILE`.

Targets are the modules of `flywheel.bench`; each defines `run(args) -> dict` returning a result with
a `summary` object (the headline figures) and the baselines measured in the same run. The machine
(CPU, cores, torch version) and the provenance (commit, uncommitted changes, date, command) are recorded
beside them. `flywheel bench table` renders every result file into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ast
import pkgutil
from pathlib import Path

HELP = "run a benchmark target and write its JSON"


def _targets() -> list[str]:
    """The public modules of flywheel.bench that define `run(args)`, read from their source (importing them
    would import torch into `--help`); a shared helper module without `run` is no target."""
    from flywheel import bench

    names = []
    for m in pkgutil.iter_modules(bench.__path__):
        if m.name.startswith("_"):
            continue
        tree = ast.parse((Path(bench.__path__[0]) / f"{m.name}.py").read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in tree.body):
            names.append(m.name)
    return sorted(names)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", choices=[*_targets(), "table"], help="what to measure; `table` writes docs/benchmarks.md "
                   "from the result files instead")
    p.add_argument("--out", default=None, help="JSON output path (default: benchmarks/results/<target>.json; "
                   "for `table`: docs/benchmarks.md)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    p.add_argument("--engines", default=None, metavar="E,E,...", help="engine: compare local, vllm and hf on one "
                   "agent workload, with vLLM's weight-update figures (flywheel/bench/_engines.py)")
    p.add_argument("--preset", default=None, choices=["tiny", "small"], help="engine --engines: the model preset "
                   "(default tiny; small = 32M parameters)")
    p.add_argument("--model", default=None, metavar="DIR", help="engine, mismatch, precision, lora: a model directory (e.g. one "
                   "`flywheel models import` wrote) instead of the preset; weights: a finished RL run's directory "
                   "(e.g. runs/real), whose own published versions are measured")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"], help="engine, mismatch: dtype of --model "
                   "(default: bfloat16 for engine, float32 for mismatch)")
    p.add_argument("--backend", default="local", choices=["local", "ray"], help="orchestrator backend (pipeline)")
    p.add_argument("--base", default=None, help="pipeline, summarize, trl: a mid-trained model directory (with its tokenizer) to "
                   "start both runs from, instead of mid-training one (e.g. runs/demo/base_model); precision: the "
                   "demo base every learning arm starts from (bench/precision_learning.py)")
    p.add_argument("--seeds", default=None, metavar="S,S,...", help="pipeline: one sync/async pair per RL seed, "
                   "e.g. --seeds 0,1,2; the summary averages the pairs (default: the config's seed)")
    p.add_argument("--ranks", default=None, metavar="N,N,...", help="trainer: rank counts to measure, 1 first (the "
                   "single-process baseline), e.g. --ranks 1,2 (default 1,2)")
    p.add_argument("--run-dir", default=None, metavar="DIR", help="online: keep the serving run's directory (event "
                   "log, weights, serve.log) in DIR, a new one, for `flywheel dashboard` (default: a temporary one); "
                   "precision --base: the arms' runs (a rerun keeps the finished ones); summarize, trl: where the runs go "
                   "(default runs/bench-<target>)")
    p.add_argument("--time-budget-s", type=float, default=None, help="envs: wall-clock budget of the run (seconds); "
                   "mining gets 70 %% of it, split evenly over the projects, and each project stops trying "
                   "candidates past its share (what it kept is verified and reported); default: no budget")
    p.add_argument("--budget-s", type=float, default=None, help="trl: wall-clock seconds of training per arm "
                   "(default 300)")
    p.add_argument("--config", default=None, metavar="TOML", help="trl: the recipe both arms run from --base "
                   "(default configs/demo.toml; configs/real.toml with --base runs/real for SmolLM2)")
    p.add_argument("--curve-points", type=int, default=None, metavar="N", help="trl: most flywheel checkpoints "
                   "evaluated (default 8) and TRL snapshots saved (every 1/N of the budget; default 10) on the way to "
                   "TRL's final score; each is one held-out evaluation")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="pipeline: a config override "
                   "for both runs, e.g. --set trainer.correction=none (repeatable); precision --base: for every arm; summarize: "
                   "for every stage (e.g. --set midtrain.summary_transcripts=0, with another --run-dir); trl: for both arms "
                   "(e.g. --set inference.dtype=bfloat16: flywheel's engine; TRL generates with its own model)")


def run(args: argparse.Namespace) -> int:
    import importlib
    import json

    from flywheel.bench._machine import load_average, machine_info, provenance

    if args.target == "table":
        from flywheel.bench._table import render, update

        out = Path(args.out or "docs/benchmarks.md")
        out.write_text(update(out, render(Path("benchmarks/results"), _targets())), encoding="utf-8")
        print(f"wrote {out}")
        return 0
    mod = importlib.import_module(f"flywheel.bench.{args.target}")
    started = provenance()  # before the run: the tree it measured
    result = mod.run(args)
    result.setdefault("machine", machine_info())
    result.setdefault("provenance", started)
    result["provenance"].setdefault("load_average_end", load_average())
    out = Path(args.out or f"benchmarks/results/{args.target}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result.get("summary", {}), indent=2))
    print(f"wrote {out}")
    return 0
