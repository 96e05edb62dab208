"""Head to head with TRL: `flywheel bench trl --base DIR --budget-s N --out FILE`.

Two arms, one after the other on the same cores, each from the same mid-trained base (DIR/base_model and its
tokenizer: what `make demo`, `make demo-real` or tests/integration/build_demo_base.py writes) and the same recipe
(`--config`: configs/demo.toml by default, configs/real.toml for SmolLM2), on the same synthetic train tasks,
with the same group size (`rollout.group_size`), sessions per step (`trainer.batch_size`), passes per batch
(`trainer.update_epochs` = TRL's `num_iterations`), learning rate, harness and reward, for the same wall-clock
budget of training:

* **flywheel**: `run_rl` of the recipe (asynchronous: its engine samples while the trainer steps), stopped
  at the budget; a checkpoint after every step.
* **TRL**: `trl.GRPOTrainer` (TRL 1.16, installed from the package index) with flywheel's multi-turn harness as its
  `rollout_func` (bench/_trl_rollout.py): the sessions are flywheel's (agent loop, tools, sandbox, grader), the
  generation is `transformers.generate` on TRL's live model batched across waiting sessions, and TRL computes the
  advantages, its GRPO loss (its default `loss_type`, `beta` = 0 as flywheel's, no reference model) and steps.
  Synchronous, as TRL is: a step's sessions are sampled, then trained on. The trainer's precision is the recipe's
  (`bf16` when `trainer.dtype` resolves to bfloat16, generation under the same autocast); its forward passes take
  as many sessions as one of flywheel's micro-batches (`_trl_rows`), with gradient accumulation up to
  `trainer.batch_size` sessions per optimizer step.

Both final models, and flywheel's per-step checkpoints in order until one reaches TRL's final score, are evaluated
on the same held-out tasks (the recipe's `eval`), so `summary` has both pass@1 with their SE, the paired
difference, `time_to_trl_final_s_flywheel` (the training time of the first flywheel checkpoint whose pass@1 is at
least TRL's final), `speedup_vs_trl` (budget / that time; null when flywheel never reaches it), and sampled and
trained tokens per second of each arm. Evaluation time is not part of the budget.

    .venv/bin/pip install trl==1.16.0          # not a dependency of flywheel
    flywheel bench trl --base runs/demo --budget-s 300 --out benchmarks/results/trl.json
    flywheel bench trl --config configs/real.toml --base runs/real --run-dir runs/bench-trl-real --budget-s 900 \
        --curve-points 3 --out benchmarks/results/trl_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from math import sqrt
from pathlib import Path

from flywheel.bench.precision_learning import DEMO_CONFIG
from flywheel.rollout.evaluate import paired_difference

DEFAULT_BUDGET_S = 300.0
MAX_CHECKPOINT_EVALS = 8
SNAPSHOTS = 10  # TRL models saved during its run, at every tenth of the budget (--curve-points N: every Nth)


def _base(path: Path) -> tuple[Path, Path]:
    """(model, tokenizer) of a run directory (its base_model/ and tokenizer/, or a base_model/ that carries its
    tokenizer, as an imported model's does) or of a model directory itself."""
    if (path / "config.json").is_file() and not (path / "base_model").is_dir():
        path = path.parent
    model = path / "base_model"
    tok = path / "tokenizer" if (path / "tokenizer" / "tokenizer.json").is_file() else model
    if not (model / "config.json").is_file() or not (tok / "tokenizer.json").is_file():
        raise SystemExit(f"--base {path}: no mid-trained base there (base_model/ and its tokenizer); run `make demo` "
                         "(or `make demo-real` for configs/real.toml) or `python tests/integration/build_demo_base.py "
                         "DIR` first")
    return model, tok


def _config(recipe: Path, run_dir: Path, model: Path, tok: Path, extra: list[str] | None = None):
    from flywheel.config import load_config

    # the base is given: the recipe's import (model.import_from) already happened in the run that made it
    return load_config(str(recipe), ["--run_dir", str(run_dir), "--model.path", str(model), "--model.import_from", "",
                                     "--tokenizer.path", str(tok), *(extra or [])])


def _trl_rows(cfg) -> int:
    """Sessions per TRL forward pass: as many whole sessions as one flywheel micro-batch holds
    (`trainer.micro_batch_tokens` over `rollout.max_total_tokens`), a divisor of `trainer.batch_size`. TRL pads
    a micro-batch to its longest row and takes the whole step's sessions in one pass otherwise, which on the real
    model would hold [32, 2048, 49152] float32 logits (12 GiB)."""
    rows = max(1, min(cfg.trainer.batch_size, cfg.trainer.micro_batch_tokens // cfg.rollout.max_total_tokens))
    while cfg.trainer.batch_size % rows:
        rows -= 1
    return rows


def _score(cfg, model_dir: Path, tokenizer, heldout, cache: Path) -> dict:
    from flywheel.pipeline.evaluation import evaluate_model

    r = evaluate_model(cfg, model_dir, tokenizer, heldout, cache)
    rates = [row["correct"] / row["n"] for row in r.per_task if row["n"]]
    return {"pass1": r.pass_at[1], "se": statistics.stdev(rates) / sqrt(len(rates)) if len(rates) > 1 else 0.0,
            "per_task": r.per_task}


def run_flywheel(cfg, run_dir: Path, model: Path, tok: Path, tasks, budget_s: float) -> dict:
    from flywheel.orchestrator.loop import run_rl

    stop = threading.Event()
    timer = threading.Timer(budget_s, stop.set)
    t0 = time.perf_counter()
    timer.start()
    try:
        rl = run_rl(cfg, run_dir, model, tok, tasks, stop_event=stop)
    finally:
        timer.cancel()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "time/elapsed_s" in r]
    last = steps[-1] if steps else {}
    return {"wall_s": time.perf_counter() - t0, "steps": rl.get("steps"), "step_elapsed_s": {
        int(r["step"]): float(r["time/elapsed_s"]) for r in steps},
        # every sampled token of the groups that came back, and the tokens of the sequences each step trained on
        "tokens_sampled_per_s": (last.get("throughput/tokens_per_s_k") or 0.0) * 1000.0,
        "trainer_tokens_per_s": (sum(float(r.get("num_tokens", 0.0)) for r in steps) / last["time/elapsed_s"]
                                 if last.get("time/elapsed_s") else None)}


def run_trl(cfg, run_dir: Path, model: Path, tok: Path, tasks, budget_s: float, snapshots_n: int = SNAPSHOTS) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from flywheel.bench._trl_rollout import HarnessRollout, flywheel_reward
    from flywheel.envs.tools import tools_for
    from flywheel.policy.chat import ChatFormat
    from flywheel.policy.tokenizer import load_tokenizer, save_tokenizer

    tokenizer = load_tokenizer(tok)
    chat = ChatFormat(tokenizer, tools_for(cfg.env), cfg.model.tool_format)
    rollout = HarnessRollout(cfg, {t.id: t for t in tasks}, chat, run_dir / "cache")
    g, rows = cfg.rollout.group_size, _trl_rows(cfg)
    # one optimizer step per `trainer.batch_size` sessions, as flywheel's: TRL samples them all (its generation
    # batch), then accumulates their gradients over micro-batches of `rows` sessions
    args = GRPOConfig(output_dir=str(run_dir / "trl"), learning_rate=cfg.trainer.lr, num_generations=g,
                      per_device_train_batch_size=rows, gradient_accumulation_steps=cfg.trainer.batch_size // rows,
                      num_iterations=cfg.trainer.update_epochs,
                      beta=0.0, max_steps=1_000_000, logging_steps=1, save_strategy="no", report_to="none",
                      # TRL's GRPOConfig turns activation checkpointing on by default; flywheel's trainer keeps
                      # activations (trainer.activation_checkpointing = false) and one row fits in memory here
                      gradient_checkpointing=cfg.trainer.activation_checkpointing,
                      use_cpu=True, bf16=cfg.trainer.dtype == "bfloat16", temperature=cfg.rollout.temperature,
                      seed=cfg.seed,
                      max_completion_length=cfg.rollout.max_total_tokens, warmup_steps=0,
                      lr_scheduler_type="constant", dataloader_num_workers=0)
    started: dict[str, float] = {}
    snapshots: dict[int, float] = {}  # optimizer step -> training seconds, a model saved at about every tenth

    class Budget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            started["t"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            elapsed = time.perf_counter() - started["t"]
            if elapsed >= budget_s:
                control.should_training_stop = True
            elif elapsed >= budget_s * (len(snapshots) + 1) / snapshots_n:
                kw["model"].save_pretrained(str(run_dir / "snapshots" / f"step_{state.global_step:08d}"))
                snapshots[int(state.global_step)] = elapsed

    # every core: TRL samples and trains in turn in this process (run_rl left it at one thread beside its engine)
    torch.set_num_threads(os.cpu_count() or 1)
    trainer = GRPOTrainer(model=str(model), reward_funcs=[flywheel_reward], args=args,
                          train_dataset=Dataset.from_dict({"prompt": [t.id for t in tasks]}),
                          processing_class=tokenizer, rollout_func=rollout, callbacks=[Budget()])
    trainer.train()
    elapsed = time.perf_counter() - started["t"]
    final = run_dir / "final_model"
    trainer.save_model(str(final))
    save_tokenizer(tokenizer, final)  # the model dir carries its tokenizer, as flywheel's final_model does
    engine = rollout.engine
    return {"wall_s": elapsed, "steps": int(trainer.state.global_step), "sessions": rollout.sessions,
            "generation_rounds": rollout.sessions // max(1, cfg.trainer.batch_size), "snapshot_elapsed_s": snapshots,
            "tokens_sampled_per_s": (engine.tokens_sampled / elapsed) if engine else None,
            "trainer_tokens_per_s": rollout.tokens_trained / elapsed,
            "generate_s": engine.generate_s if engine else None,
            "settings": {k: getattr(args, k) for k in ("learning_rate", "num_generations", "per_device_train_batch_size",
                                                       "gradient_accumulation_steps", "generation_batch_size",
                                                       "gradient_checkpointing",
                                                       "num_iterations", "beta", "loss_type", "temperature", "bf16")}}


def _arm(run_dir: Path, budget: float, go) -> dict:
    """An arm's figures: kept in run_dir/arm.json once it finished with this budget (a rerun evaluates again
    without training again), else the directory is started afresh."""
    done = run_dir / "arm.json"
    if done.is_file() and json.loads(done.read_text()).get("budget_s") == budget:
        return json.loads(done.read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    result = {**go(run_dir), "budget_s": budget}
    done.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def run(args: argparse.Namespace) -> dict:
    from flywheel.bench.pipeline import set_overrides
    from flywheel.pipeline.prepare import prepare_tasks
    from flywheel.policy.tokenizer import load_tokenizer, save_tokenizer
    from flywheel.trainer import checkpoint as ckpt

    budget = float(getattr(args, "budget_s", None) or DEFAULT_BUDGET_S)
    recipe = Path(getattr(args, "config", None) or DEMO_CONFIG)
    overrides = set_overrides(getattr(args, "set", None))  # both arms and every evaluation
    points = int(getattr(args, "curve_points", None) or MAX_CHECKPOINT_EVALS)
    model, tok = _base(Path(args.base or "runs/demo"))
    root = Path(getattr(args, "run_dir", None) or "runs/bench-trl")
    fw_cfg = _config(recipe, root / "flywheel", model, tok, [*overrides, "--trainer.num_steps", "100000",
                                                              "--trainer.checkpoint_every", "1",
                                                              "--trainer.keep_checkpoints", "0"])
    train, heldout = prepare_tasks(fw_cfg, root / "tasks")
    fw = _arm(root / "flywheel", budget, lambda d: run_flywheel(fw_cfg, d, model, tok, train, budget))
    snapshots_n = int(getattr(args, "curve_points", None) or SNAPSHOTS)
    tr = _arm(root / "trl", budget, lambda d: run_trl(_config(recipe, d, model, tok, overrides), d, model, tok, train, budget,
                                                      snapshots_n))
    steps = sorted(ckpt.list_checkpoints(root / "flywheel" / "checkpoints"), key=lambda p: p.name)
    if not steps:
        raise SystemExit(f"the flywheel arm left no checkpoint under {root / 'flywheel' / 'checkpoints'}")
    tokenizer = load_tokenizer(tok)
    # a run stopped by its budget writes no final_model (orchestrator/loop.py): its last step's checkpoint is it
    fw_final = ckpt.export_model(model, steps[-1], root / "eval" / "fw_final_model")
    scores = {"base": _score(fw_cfg, model, tokenizer, heldout, root / "eval" / "base"),
              "flywheel": _score(fw_cfg, fw_final, tokenizer, heldout, root / "eval" / "fw"),
              "trl": _score(fw_cfg, root / "trl" / "final_model", tokenizer, heldout, root / "eval" / "trl")}
    target = scores["trl"]["pass1"]
    stride = max(1, -(-len(steps) // points))
    curve, reached = [], None
    for step_dir in steps[stride - 1::stride]:
        version = int(step_dir.name.rsplit("_", 1)[-1])
        m = ckpt.export_model(model, step_dir, root / "eval" / "ckpt_model")
        s = _score(fw_cfg, m, tokenizer, heldout, root / "eval" / f"ckpt{version}")
        t = fw["step_elapsed_s"].get(version, fw["step_elapsed_s"].get(str(version)))  # JSON keys are strings
        curve.append({"step": version, "elapsed_s": t, "pass1": s["pass1"]})
        if s["pass1"] >= target and t is not None:
            reached = t
            break
    # TRL's own curve, on its snapshots: when did it first reach its final score?
    trl_curve, trl_reached = [], None
    for snap in sorted((root / "trl" / "snapshots").glob("step_*")):
        save_tokenizer(tokenizer, snap)
        s = _score(fw_cfg, snap, tokenizer, heldout, root / "eval" / f"trl_{snap.name}")
        step = int(snap.name.rsplit("_", 1)[-1])
        t = tr["snapshot_elapsed_s"].get(step, tr["snapshot_elapsed_s"].get(str(step)))
        trl_curve.append({"step": step, "elapsed_s": t, "pass1": s["pass1"]})
        if s["pass1"] >= target and t is not None:
            trl_reached = t
            break
    diff, diff_se, _ = paired_difference(scores["flywheel"]["per_task"], scores["trl"]["per_task"])
    summary = {
        "budget_s": budget,
        "heldout_pass1_base": scores["base"]["pass1"],
        "heldout_pass1_flywheel": scores["flywheel"]["pass1"], "heldout_pass1_flywheel_se": scores["flywheel"]["se"],
        "heldout_pass1_trl": scores["trl"]["pass1"], "heldout_pass1_trl_se": scores["trl"]["se"],
        "flywheel_minus_trl": diff, "flywheel_minus_trl_paired_se": diff_se,
        "time_to_trl_final_s_flywheel": reached,
        "speedup_vs_trl": (budget / reached) if reached else None,
        # TRL's own first time at its final score (its snapshots, every tenth of the budget; the budget when none
        # reached it earlier), over flywheel's: the same score, each system's time
        "time_to_trl_final_s_trl": trl_reached if trl_reached is not None else tr["wall_s"],
        "speedup_to_the_same_score": ((trl_reached if trl_reached is not None else tr["wall_s"]) / reached
                                      if reached else None),
        "steps_flywheel": fw["steps"], "steps_trl": tr["steps"],
        "tokens_sampled_per_s_flywheel": fw["tokens_sampled_per_s"], "tokens_sampled_per_s_trl": tr["tokens_sampled_per_s"],
        "trainer_tokens_per_s_flywheel": fw["trainer_tokens_per_s"], "trainer_tokens_per_s_trl": tr["trainer_tokens_per_s"],
        "num_heldout_tasks": len(heldout),
    }
    for s in scores.values():
        s.pop("per_task")
    return {"summary": summary, "flywheel": fw, "trl": tr, "scores": scores, "flywheel_curve": curve,
            "trl_curve": trl_curve,
            "setup": {"config": str(recipe), "overrides": getattr(args, "set", None) or [], "base": str(model),
                      "mode": "multi-turn, flywheel's harness in both (TRL through rollout_func)",
                      "run_dir": str(root)}}
