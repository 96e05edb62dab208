"""Low precision: the train-inference mismatch of fp8 and fp4 samplers and fp8 trainers, and what TIS, MIS and IcePop do to it.

    flywheel bench precision --out benchmarks/results/precision.json [--quick]
    flywheel bench precision --model models/smollm2 --out FILE      # one real model instead of the trained preset
    flywheel bench precision --base runs/demo --out FILE            # learning per precision (precision_learning.py)

For each (sampler, trainer) pair the engine serves one workload (sessions sampled at temperature 1, seeded) and
the Trainer takes one step on those trajectories; k3 and max |Δ log p| are the step's own mismatch metrics
(`bench/mismatch.py` serves, builds the trajectories and the trainer). The sampler is a bfloat16 copy of the
model (as inference engines serve), with `inference.weight_dtype` / `inference.kv_dtype` fake-quantizing its
decoder weights and KV cache (modeling/quant.py); the trainer holds the float32 master weights and computes in
bf16 autocast (`trainer.dtype = "bfloat16"`), with `trainer.matmul_precision` rounding every decoder Linear's
operands to fp8 (trainer/precision.py). Both sides compute the LM head in fp32 (`numerics.fp32_lm_head`).
The preset is the `tiny` model trained here on `mismatch.synthetic_text` (a random-init model's near-uniform
next-token distribution hides what rounding does to a peaked one), sampled on prompts from that text.

Corrections, from the per-token log-ratios d = log π_trainer − log μ_sampler of the same step (the trainer's
recomputed log-probs): each correction's weights w (trainer/losses.correction_weights, trainer defaults C = 2,
IcePop [0.5, 2]; MIS is sequence-level) against the exact importance weight ρ they stand in for (the token's
ratio exp(d); MIS: the sequence's). `weight_error` = mean |w − ρ| over tokens (no correction: w = 1, so it is the
raw mismatch seen by the gradient; 0 = the exact on-policy weight); `kept_frac` = tokens with w > 0;
`k3_kept` / `max_abs_dlogp_kept` = the mismatch among the kept tokens (what the masked corrections leave).
In the summary, per pair: `weight_error_none`, the largest `weight_error` of TIS, MIS and IcePop
(`weight_error_corrected_max`), and the smallest `kept_frac` of MIS and IcePop (`kept_frac_min`); every
correction's figures are under `measured.pairs`.
`delta_bytes_per_version`: the bytes the weight store publishes (weights/sync.py Publisher, weights/codec.py) for
the delta between two versions of the decoder matrices (the model before and after one AdamW step at lr 1e-5 on
synthetic text) in each format's served form (`weights.publish_served`): bf16 bits, fp8 bytes, packed e2m1
nibbles, each with its scales (`scale_bytes`: the scales' share of the delta).
"""

from __future__ import annotations

import copy
import functools
import os
import random
import tempfile
import time
from pathlib import Path

import torch

from flywheel.bench.mismatch import (
    VOCAB,
    make_trainer,
    serve,
    synthetic_text,
    synthetic_workload,
    train_on_synthetic,
    trajectories,
)
from flywheel.config import ModelConfig
from flywheel.modeling.lm_head import use_fp32_lm_head
from flywheel.modeling.quant import SCALES, is_quantized_weight, served_tensors_and_values
from flywheel.policy.model import build_model, load_model
from flywheel.policy.tokenizer import load_tokenizer
from flywheel.trainer.losses import correction_weights
from flywheel.trainer.mismatch import mismatch_metrics
from flywheel.types import SamplingParams
from flywheel.weights.sync import Publisher

# (name, engine weight_dtype, engine kv_dtype, trainer matmul_precision)
PAIRS = [
    ("bf16/bf16", "bf16", "bf16", "bf16"),
    ("bf16/fp8", "bf16", "bf16", "fp8_tensor"),
    ("fp8/bf16", "fp8_e4m3", "bf16", "bf16"),
    ("fp8_block/bf16", "fp8_e4m3_block", "bf16", "bf16"),
    ("fp8+kv/bf16", "fp8_e4m3", "fp8_e4m3", "bf16"),
    ("fp8/fp8", "fp8_e4m3", "bf16", "fp8_tensor"),
    ("fp8_block/fp8_block", "fp8_e4m3_block", "bf16", "fp8_block"),
    ("mxfp4/bf16", "mxfp4", "bf16", "bf16"),
    ("nvfp4/bf16", "nvfp4", "bf16", "bf16"),
]
CORRECTIONS = ("none", "tis", "mis", "icepop")


def _token_ratios(trainer, trajs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the trainer's last step: trainer and sampler log-probs, mask and sequence ids, [num_trajs, T]."""
    rows_t, rows_s = [], []
    for i, traj in enumerate(trajs):
        seg = traj.segments[0]
        got = trainer.recomputed_logprobs(i)
        assert got is not None, "every trajectory of the bench is trained on"
        rows_t.append([float("nan") if v is None or not m else v for v, m in zip(got[0], seg.loss_mask)])
        rows_s.append(seg.logprobs)
    t = max(len(r) for r in rows_t)
    pad = [r + [float("nan")] * (t - len(r)) for r in rows_t]
    lp_t = torch.tensor(pad, dtype=torch.float64)
    lp_s = torch.tensor([r + [0.0] * (t - len(r)) for r in rows_s], dtype=torch.float64)
    mask = ~torch.isnan(lp_t)
    return lp_t.nan_to_num(0.0), lp_s.masked_fill(~mask, 0.0), mask, torch.arange(len(trajs))[:, None].expand(-1, t)


def corrections(lp_t: torch.Tensor, lp_s: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor) -> dict:
    """Per correction: weight_error (mean |w - rho|), kept_frac, k3_kept, max_abs_dlogp_kept (module docstring)."""
    d = (lp_t - lp_s).masked_fill(~mask, 0.0)
    rho_tok = d.exp()
    rho_seq = d.sum(-1, keepdim=True).exp().expand_as(d)  # one trajectory per row here
    out = {}
    n = int(mask.sum())
    for kind in CORRECTIONS:
        w, _ = correction_weights(lp_t.float(), lp_s.float(), mask, kind, seq_ids=seq_ids[:, 0])
        w = w.double()
        rho = rho_seq if kind == "mis" else rho_tok
        kept = mask & (w > 0)
        err = float(((w - rho).abs() * mask).sum()) / n
        mm = mismatch_metrics(lp_t, lp_s, kept)
        out[kind] = {"weight_error": err, "kept_frac": int(kept.sum()) / n, "k3_kept": mm["k3"],
                     "max_abs_dlogp_kept": mm["max_abs_diff"]}
    return out


def delta_bytes(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], fmt: str) -> dict:
    """The bytes a weight store publishes for version `after` against `before`, both in the served form of `fmt`
    (weights.publish_served: the decoder matrices as the format's codes and scales; bf16: their bf16 bits),
    through the real Publisher (module docstring)."""
    names = [n for n, t in before.items() if is_quantized_weight(n, t)]
    bf16 = fmt == "bf16"
    with tempfile.TemporaryDirectory() as root:
        with Publisher(root, anchor_every=1000, num_threads=1, dtype="bfloat16" if bf16 else None,
                       served_format="" if bf16 else fmt,
                       to_served=None if bf16 else functools.partial(served_tensors_and_values, fmt=fmt)) as pub:
            pub.publish(0, {n: before[n] for n in names}).result()
            m = pub.publish(1, {n: after[n] for n in names}).result()
            old, new = (pub.store.read_manifest(v)["tensors"] for v in (0, 1))
    scale_bytes = sum(size for n, e in new.items() if n.endswith(SCALES) and e["hash"] != old[n]["hash"]
                      for _, size in e["delta"])  # the delta chunks of the scales that changed
    return {"delta_bytes": m["bytes_published"], "scale_bytes": scale_bytes, "changed_frac": m["changed_fraction"]}


def _two_versions(model) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The master weights before and after one AdamW step (lr 1e-5, next-token loss on 8 x 64 tokens of
    `mismatch.synthetic_text`): two consecutive versions a publisher would send."""
    m = copy.deepcopy(model).train()
    before = {n: t.detach().clone() for n, t in m.state_dict().items()}
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.0)
    ids = synthetic_text(8, 64, torch.Generator().manual_seed(11)) % int(m.config.vocab_size)
    m(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return before, {n: t.detach().clone() for n, t in m.state_dict().items()}


def _measure(model, prompts, params, label: str) -> dict:
    sampler = use_fp32_lm_head(copy.deepcopy(model).to(torch.bfloat16))
    master = use_fp32_lm_head(copy.deepcopy(model))
    gens: dict[tuple[str, str], list] = {}
    engine_tps: dict[str, float] = {}
    rows = {}
    for name, wdt, kvdt, prec in PAIRS:
        if (wdt, kvdt) not in gens:
            gens[(wdt, kvdt)], tps = serve(copy.deepcopy(sampler), prompts, params, False, weight_dtype=wdt,
                                           kv_dtype=kvdt)
            engine_tps[f"{wdt}+kv_{kvdt}"] = tps
        trajs = trajectories(prompts, gens[(wdt, kvdt)])
        trainer = make_trainer(master, False, False, dtype="bfloat16", matmul_precision=prec)
        t0 = time.perf_counter()
        m = trainer.step(trajs)
        step_s = time.perf_counter() - t0
        corr = corrections(*_token_ratios(trainer, trajs))
        rows[name] = {"weight_dtype": wdt, "kv_dtype": kvdt, "matmul_precision": prec, "k3": m["mismatch/k3"],
                      "max_abs_dlogp": m["mismatch/max_abs_diff"], "mean_abs_dlogp": m["mismatch/mean_abs_diff"],
                      "frac_outside_0.5_2": m["mismatch/frac_outside_0.5_2"], "corrections": corr,
                      "trainer_step_s": step_s}
    before, after = _two_versions(model)
    deltas = {fmt: delta_bytes(before, after, fmt) for fmt in ("bf16", "fp8_e4m3", "fp8_e4m3_block", "mxfp4", "nvfp4")}
    return {"label": label, "pairs": rows, "engine_tokens_per_s": engine_tps, "delta": deltas,
            "num_sessions": len(prompts), "num_generated_tokens": sum(len(g.token_ids) for g in gens[("bf16", "bf16")])}


def _text_workload(model_dir: str, quick: bool) -> tuple[list[list[int]], list[SamplingParams]]:
    """--model: prompts cut from this repository's docs (docs/*.md), tokenized with the model's tokenizer."""
    tok = load_tokenizer(model_dir)
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(Path("docs").glob("*.md")))
    ids = tok(text)["input_ids"]
    num, lo, hi, new = (16, 20, 60, 16) if quick else (32, 30, 120, 48)
    rng = random.Random(7)
    prompts = []
    for _ in range(num):
        n, at = rng.randint(lo, hi), rng.randrange(len(ids) - hi)
        prompts.append(ids[at:at + n])
    return prompts, [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(num)]


def _summary(measured: dict) -> dict:
    rows, base = measured["pairs"], measured["pairs"]["bf16/bf16"]
    out: dict = {}
    for name, r in rows.items():
        out[f"k3 {name}"] = r["k3"]
        out[f"max_abs_dlogp {name}"] = r["max_abs_dlogp"]
        out[f"k3_vs_bf16 {name}"] = r["k3"] / base["k3"] if base["k3"] > 0 else None
        corr = r["corrections"]
        out[f"weight_error_none {name}"] = corr["none"]["weight_error"]
        out[f"weight_error_corrected_max {name}"] = max(corr[k]["weight_error"] for k in ("tis", "mis", "icepop"))
        out[f"kept_frac_min {name}"] = min(corr[k]["kept_frac"] for k in ("mis", "icepop"))
    for fmt, d in measured["delta"].items():
        out[f"delta_bytes_per_version {fmt}"] = d["delta_bytes"]
    return out


def run(args) -> dict:
    if getattr(args, "base", None):  # learning per precision (bench/precision_learning.py)
        from flywheel.bench.precision_learning import run_learning
        return run_learning(args)
    quick = bool(getattr(args, "quick", False))
    load_start = os.getloadavg()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if getattr(args, "model", None):
            model = load_model(args.model, "float32")
            model.config.max_position_embeddings = min(model.config.max_position_embeddings, 1024)
            model.config.eos_token_id = None  # every session generates its full length
            prompts, params = _text_workload(args.model, quick)
            measured = _measure(model, prompts, params, args.model)
            extra = {"model": args.model, "model_type": model.config.model_type}
        else:
            model = build_model(ModelConfig(preset="tiny", max_seq_len=1024), vocab_size=VOCAB)
            num_steps = 40 if quick else 200
            t0 = time.perf_counter()
            losses = train_on_synthetic(model, num_steps)
            extra = {"model": "tiny (trained here)", "train_steps": num_steps, "train_s": time.perf_counter() - t0,
                     "loss_first": losses[0], "loss_last": sum(losses[-10:]) / len(losses[-10:])}
            prompts, params = synthetic_workload(quick)
            measured = _measure(model, prompts, params, "tiny")
    finally:
        torch.set_num_threads(threads)
    summary = {**_summary(measured), "num_generated_tokens": measured["num_generated_tokens"], "quick": quick,
               "torch_threads": 1, "load_avg_start": load_start, "load_avg_end": os.getloadavg()}
    return {"summary": summary, "setup": extra, "measured": measured}

