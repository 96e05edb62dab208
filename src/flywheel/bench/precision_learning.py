"""Learning per precision: the demo's RL from one mid-trained base, with an fp8 sampler and an fp8 trainer.

    flywheel bench precision --base runs/demo --out benchmarks/results/precision_learning.json \
        [--run-dir runs/bench/precision] [--set trainer.num_steps=8]

`--base DIR` takes a demo run's mid-trained base (DIR/base_model and DIR/tokenizer, what `make demo` or
tests/integration/build_demo_base.py writes; DIR/base_model itself works too) and runs configs/demo.toml's RL from
it once per arm, one after the other with the same seed, tasks and steps (`--set` overrides apply to every arm;
`--run-dir` keeps the arms' runs, and a rerun skips the arms that finished there); only the precision and the
off-policy correction differ:

| arm | sampler (`inference.weight_dtype`) | trainer (`trainer.matmul_precision`) | `trainer.correction` |
|---|---|---|---|
| `baseline` | as loaded (float32) | float32 | tis |
| `fp8_sampler` | fp8 e4m3, per tensor | float32 | tis |
| `fp8_sampler_none` | fp8 e4m3, per tensor | float32 | none |
| `fp8_both` | fp8 e4m3, per tensor | fp8 e4m3, per tensor | tis |
| `fp8_both_none` | fp8 e4m3, per tensor | fp8 e4m3, per tensor | none |

Every arm is evaluated on the same held-out tasks (the base's own evaluation is shared: DIR/eval_before.jsonl when
it is there), so the summary gives each arm's pass@1 after RL, its gain over the base, and its difference from
the baseline arm with the paired SE over tasks (`rollout/evaluate.paired_difference`). The demo trains in float32
(configs/demo.toml): the baseline is the float32 sampler and trainer, which the bf16 row of the mismatch table
matches in spirit (no rounding of the served weights).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from flywheel.rollout.evaluate import paired_difference

DEMO_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "demo.toml"
ARMS: dict[str, list[str]] = {
    "baseline": [],
    "fp8_sampler": ["--inference.weight_dtype", "fp8_e4m3"],
    "fp8_sampler_none": ["--inference.weight_dtype", "fp8_e4m3", "--trainer.correction", "none"],
    "fp8_both": ["--inference.weight_dtype", "fp8_e4m3", "--trainer.matmul_precision", "fp8_tensor"],
    "fp8_both_none": ["--inference.weight_dtype", "fp8_e4m3", "--trainer.matmul_precision", "fp8_tensor",
                      "--trainer.correction", "none"],
}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def learning_arms(base: Path, out_dir: Path, overrides: list[str], arms: list[str] | None = None) -> dict:
    """Run each arm's RL from `base` into `out_dir/<arm>` (kept where a finished summary is there) and compare."""
    from flywheel.config import load_config
    from flywheel.pipeline.job import run_job

    if (base / "config.json").is_file() and not (base / "base_model").is_dir():
        base = base.parent  # DIR/base_model given
    model, tokenizer = base / "base_model", base / "tokenizer"
    if not (model / "config.json").is_file() or not (tokenizer / "tokenizer.json").is_file():
        raise ValueError(f"--base {base}: no mid-trained base there (base_model/ and tokenizer/); run `make demo` "
                         "or `python tests/integration/build_demo_base.py DIR` first")
    results: dict[str, dict] = {}
    for name in arms or list(ARMS):
        run_dir = out_dir / name
        if (run_dir / "summary.json").is_file() and "pass1_after" in json.loads((run_dir / "summary.json").read_text()):
            summary = json.loads((run_dir / "summary.json").read_text())
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            shared = base / "eval_before.jsonl"
            if shared.is_file() and not (run_dir / "summary.json").is_file():  # the base's evaluation, once
                rows = _rows(shared)
                pass1 = sum(r["correct"] / r["n"] for r in rows if r["n"]) / max(1, sum(1 for r in rows if r["n"]))
                shutil.copyfile(shared, run_dir / "eval_before.jsonl")
                (run_dir / "summary.json").write_text(json.dumps({"pass1_before": pass1}) + "\n")
            cfg = load_config(str(DEMO_CONFIG), ["--run_dir", str(run_dir), "--model.path", str(model),
                                                 "--tokenizer.path", str(tokenizer), *overrides, *ARMS[name]])
            t0 = time.perf_counter()
            summary = run_job(cfg, show_progress=False)
            summary["arm_wall_s"] = time.perf_counter() - t0
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        results[name] = {"overrides": ARMS[name], "pass1_before": summary["pass1_before"],
                         "pass1_after": summary["pass1_after"], "gain": summary["pass1_gain"],
                         "gain_se": summary.get("pass1_gain_se"), "wall_s": summary.get("arm_wall_s"),
                         **_mismatch(run_dir)}
    if "baseline" in results:
        base_rows = _rows(out_dir / "baseline" / "eval_after.jsonl")
        for name, r in results.items():
            if name != "baseline":
                diff, se, _ = paired_difference(_rows(out_dir / name / "eval_after.jsonl"), base_rows)
                r["vs_baseline"], r["vs_baseline_se"] = diff, se
    return results


def _mismatch(run_dir: Path) -> dict[str, float | None]:
    """The run's mean k3 and largest max |Δ log p| over its steps (metrics.jsonl, read once)."""
    path = run_dir / "metrics.jsonl"
    rows = _rows(path) if path.is_file() else []
    k3 = [float(r["mismatch/k3"]) for r in rows if isinstance(r.get("mismatch/k3"), (int, float))]
    dlogp = [float(r["mismatch/max_abs_diff"]) for r in rows if isinstance(r.get("mismatch/max_abs_diff"), (int, float))]
    return {"k3_mean": sum(k3) / len(k3) if k3 else None, "max_abs_dlogp_max": max(dlogp) if dlogp else None}


def run_learning(args) -> dict:
    """`flywheel bench precision --base DIR`: the arms, their summary and setup."""
    import os
    import tempfile

    from flywheel.bench.pipeline import set_overrides

    overrides = set_overrides(getattr(args, "set", None))
    out_dir = Path(args.run_dir) if getattr(args, "run_dir", None) else Path(tempfile.mkdtemp(prefix="fw-prec-"))
    load_start = os.getloadavg()
    results = learning_arms(Path(args.base), out_dir, overrides)
    summary = {**learning_summary(results), "load_avg_start": load_start, "load_avg_end": os.getloadavg()}
    return {"summary": summary, "setup": {"base": str(args.base), "config": str(DEMO_CONFIG), "overrides": overrides,
                                          "arms": ARMS, "run_dir": str(out_dir)}, "measured": results}


def learning_summary(results: dict) -> dict:
    out: dict = {}
    for name, r in results.items():
        out[f"pass1 {name}"] = r["pass1_after"]
        out[f"gain {name}"] = r["gain"]
        if "vs_baseline" in r:
            out[f"vs_baseline {name}"] = r["vs_baseline"]
            out[f"vs_baseline_se {name}"] = r["vs_baseline_se"]
    return out
