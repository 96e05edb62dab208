"""Train-inference mismatch: default vs batch-invariant vs router replay, dense and MoE, in one run.

    flywheel bench mismatch --out benchmarks/results/mismatch.json [--quick]
    flywheel bench mismatch --model models/smollm2 --out FILE      # one real model: default and batch-invariant

For each preset (`tiny`, `tiny-moe`) the engine serves one agent-like workload (N concurrent sessions,
random prompts, sampled at temperature 1, seeded) in its default mode and in batch-invariant mode; the
Trainer then takes one step on those trajectories (default: HF forward; batch_invariant: the native
forward; router_replay: HF forward with the sampler's experts). The step's own metrics give the mismatch
(k3, max |Δ log p|, the trainer's own top-k agreement with the sampler) and its tokens/s; the engine's
wall time gives its tokens/s. Costs are 1 - mode tokens/s / default tokens/s, medians over repeats (5; 1 with --quick),
modes interleaved so that load from other processes hits them alike.

Router replay is measured with an fp32 sampler (same math as the trainer up to reduction order:
routing almost never flips) and with a bfloat16 sampler (how production inference runs; routing flips),
on the random-init tiny-moe and on a tiny-moe TRAINED here (`train_on_synthetic`: next-token steps on a seeded
synthetic corpus, so routers have learned, uneven gates and near-ties like a real MoE). The headline
`replay_k3_reduction_moe` = k3(bf16 sampler, trainer on the same bf16 weights, routing freely) / k3(same
samples, trainer replays the sampler's experts), on the trained model with prompts from its training
distribution, both sides computing the logits in fp32 (`numerics.fp32_lm_head`, the default) — the
production setting, where engine and trainer hold the same bf16 weights and differ only in kernels and
batching. `replay_k3_reduction_moe_bf16_head` is the same with bf16 logits (their rounding is most of what
replay leaves); `replay_k3_reduction_moe_fp32_trainer` the same ratio with the fp32 trainer, whose every op
also differs from the sampler's by bf16 rounding; `fp32_head_engine_cost_moe` the bf16 engine's tokens/s
cost of fp32 logits;
`routing_flip_frac_moe` is the fraction of generated (token, layer) pairs whose experts in the trainer's
free forward differ from the sampler's. `replay_expert_agreement` (experts the trainer forward actually
used == the sampler's, with replay) must be 1.0. One torch thread (tiny models on a shared machine).

Engine cost: measured against the engine's default mode, which pads no rows (linears run on exactly the live
rows) and attends over all rows in one SDPA call per layer, so the cost is all that batch invariance adds
(rows padded to 16, fixed 64-key tiles, 8-row query blocks). Modes are interleaved per repeat and each repeat
is one whole workload; the cost is 1 - median(mode tokens/s) / median(default tokens/s) from wall time, and
also from process CPU time (`*_cpu`), which other processes' load on a shared machine disturbs much less.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import statistics
import time

import torch

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.inference.local import LocalEngine
from flywheel.modeling.lm_head import use_fp32_lm_head
from flywheel.policy.model import build_model, load_model
from flywheel.trainer.replay import record_routing, router_replay
from flywheel.trainer.train import Trainer
from flywheel.types import Generation, Reward, SamplingParams, Segment, Trajectory

VOCAB = 2048


def workload(quick: bool, seed: int = 0):
    rng = random.Random(seed)
    num, lo, hi, new = (16, 20, 100, 16) if quick else (32, 50, 300, 48)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))] for _ in range(num)]
    params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(num)]
    return prompts, params


def serve(model, prompts, params, batch_invariant: bool, cpu: list | None = None, **engine_kw):
    """The sessions served concurrently by one LocalEngine (`engine_kw`: its other settings, e.g. weight_dtype);
    (generations, tokens/s from wall time); appends tokens per CPU second to `cpu`."""
    async def main():
        async with LocalEngine(model, batch_invariant=batch_invariant, max_seq_len=1024, **engine_kw) as engine:
            t0, c0 = time.perf_counter(), time.process_time()
            gens = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))
            return gens, time.perf_counter() - t0, time.process_time() - c0
    gens, wall_s, cpu_s = asyncio.run(main())
    num_tokens = sum(len(g.token_ids) for g in gens)
    if cpu is not None:
        cpu.append(num_tokens / cpu_s)
    return gens, num_tokens / wall_s


def synthetic_text(num_seqs: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """[num_seqs, seq_len] token ids over the first 512 of the vocabulary: each sequence follows one of 4
    seeded sparse bigram chains ("topics"; 3 successors per token), so the next token depends on the token
    and on the topic, which only the context tells."""
    num_tokens, num_topics, fanout = 512, 4, 3
    succ = torch.randint(0, num_tokens, (num_topics, num_tokens, fanout), generator=torch.Generator().manual_seed(1234))
    topic = torch.randint(0, num_topics, (num_seqs,), generator=generator)
    tok = torch.randint(0, num_tokens, (num_seqs,), generator=generator)
    out = torch.empty(num_seqs, seq_len, dtype=torch.long)
    for t in range(seq_len):
        out[:, t] = tok
        tok = succ[topic, tok, torch.randint(0, fanout, (num_seqs,), generator=generator)]
    return out


def train_on_synthetic(model, num_steps: int, seed: int = 0) -> list[float]:
    """`num_steps` AdamW next-token steps (batch 16 x 64 tokens, lr 3e-3) on `synthetic_text`, seeded.
    Returns the loss curve (first and last steps)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(num_steps):
        ids = synthetic_text(16, 64, g)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    model.zero_grad(set_to_none=True)
    return losses


def _replay_mismatch(model, prompts, params, repeats: int = 1) -> dict:
    """bf16 sampler (a bfloat16 copy of `model` in the engine) vs the trainer, routing freely and with router
    replay: k3, max |d log p|, used-expert agreement. The trainer holds the fp32 weights, or the same bf16
    weights; and both sides compute the LM head in bf16, or in fp32 (`numerics.fp32_lm_head`, the default),
    each with its own samples. Engine tokens/s of the two heads: medians of `repeats` interleaved serves."""
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    m16h = use_fp32_lm_head(copy.deepcopy(m16))
    tps: dict[str, list[float]] = {"bf16_head": [], "fp32_head": []}
    gens: dict[str, list[Generation]] = {}
    for _ in range(repeats):
        for name, m in (("bf16_head", m16), ("fp32_head", m16h)):
            g, t = serve(m, prompts, params, batch_invariant=False)
            tps[name].append(t)
            gens.setdefault(name, g)
    t16, t16h = trajectories(prompts, gens["bf16_head"]), trajectories(prompts, gens["fp32_head"])
    free, rep = trainer_step(model, t16, False, False), trainer_step(model, t16, True, False)
    used = _used_expert_agreement(model, prompts, gens["bf16_head"])

    def same_weights(m, trajs) -> dict:
        """The trainer forward on the sampler's own bf16 weights (FSDP/Megatron-style bf16 params): only the
        kernels and batching differ from the sampler, as between vLLM and a bf16 trainer in production."""
        f, r = trainer_step(m, trajs, False, False), trainer_step(m, trajs, True, False)
        return {"k3_default": f["mismatch/k3"], "k3_router_replay": r["mismatch/k3"],
                "max_abs_dlogp_default": f["mismatch/max_abs_diff"],
                "max_abs_dlogp_router_replay": r["mismatch/max_abs_diff"],
                "routing_flip_frac": 1.0 - f["router_agreement"],
                "k3_reduction": _ratio(f["mismatch/k3"], r["mismatch/k3"])}

    head_tps = {k: statistics.median(v) for k, v in tps.items()}
    return {
        "default": {"k3": free["mismatch/k3"], "max_abs_dlogp": free["mismatch/max_abs_diff"],
                    "used_expert_agreement": used["default"]},
        "router_replay": {"k3": rep["mismatch/k3"], "max_abs_dlogp": rep["mismatch/max_abs_diff"],
                          "used_expert_agreement": used["replay"]},
        "routing_flip_frac": 1.0 - used["default"],
        "k3_reduction": _ratio(free["mismatch/k3"], rep["mismatch/k3"]),
        "bf16_trainer": same_weights(m16, t16),
        "bf16_trainer_fp32_head": same_weights(m16h, t16h),
        "engine_tokens_per_s": head_tps, "engine_tokens_per_s_runs": tps,
        "fp32_head_engine_cost": 1 - head_tps["fp32_head"] / head_tps["bf16_head"],
        "num_generated_tokens": sum(len(g.token_ids) for g in gens["bf16_head"]),
    }


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def synthetic_workload(quick: bool, seed: int = 7) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts cut from `synthetic_text` (the distribution `train_on_synthetic` trains on), seeded sampling."""
    num, lo, hi, new = (16, 20, 60, 16) if quick else (32, 30, 120, 48)
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    text = synthetic_text(num, hi, g)
    prompts = [text[i, :rng.randint(lo, hi)].tolist() for i in range(num)]
    params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(num)]
    return prompts, params


def _trained_moe(quick: bool, repeats: int = 1) -> dict:
    """Router replay on a tiny-moe trained on synthetic text, sampled on prompts from that text."""
    model = build_model(ModelConfig(preset="tiny-moe", max_seq_len=1024), vocab_size=VOCAB)
    num_steps = 60 if quick else 300
    t0 = time.perf_counter()
    losses = train_on_synthetic(model, num_steps)
    train_s = time.perf_counter() - t0
    prompts, params = synthetic_workload(quick)
    out = _replay_mismatch(model, prompts, params, repeats)
    out.update({"train_steps": num_steps, "train_s": train_s, "loss_first": losses[0],
                "loss_last": sum(losses[-10:]) / len(losses[-10:])})
    return out


def trajectories(prompts, gens) -> list[Trajectory]:
    out = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        routed = None if g.routed_experts is None else [[] for _ in p] + g.routed_experts
        seg = Segment(token_ids=p + g.token_ids, loss_mask=[0] * len(p) + [1] * len(g.token_ids),
                      logprobs=[0.0] * len(p) + g.logprobs, versions=[0] * (len(p) + len(g.token_ids)),
                      routed_experts=routed)
        out.append(Trajectory(task_id="bench", group_id=f"g{i % 4}", segments=[seg],
                              reward=Reward(value=float(i % 2))))
    return out


def make_trainer(model, replay: bool, bi: bool, **cfg_kw) -> Trainer:
    """A Trainer on a copy of `model` (lr 1e-6, 4096-token micro-batches; `cfg_kw`: other TrainerConfig keys)."""
    cfg = TrainerConfig(**{"lr": 1e-6, "router_replay": replay, "micro_batch_tokens": 4096, **cfg_kw})
    return Trainer(copy.deepcopy(model), cfg, batch_invariant=bi)


def trainer_step(model, trajs, replay: bool, bi: bool) -> dict:
    return make_trainer(model, replay, bi).step(trajs)


def _used_expert_agreement(model, prompts, gens) -> dict[str, float]:
    """Fraction of generated (token, layer) pairs whose experts in the trainer's HF forward equal the
    sampler's: routing freely and with replay."""
    out = {}
    for replay in (False, True):
        agree = total = 0
        for p, g in zip(prompts, gens):
            ids = torch.tensor([p + g.token_ids])
            sampler = torch.full((1, ids.shape[1], len(g.routed_experts[0]), len(g.routed_experts[0][0])), -1)
            for i, e in enumerate(g.routed_experts):  # token i was produced at input position len(p) - 1 + i
                sampler[0, len(p) - 1 + i] = torch.tensor(e)
            with torch.no_grad(), record_routing(model) as rec, router_replay(model, sampler if replay else None):
                model(input_ids=ids)
            used = rec.experts()  # [T, L, K]
            pos = slice(len(p) - 1, len(p) - 1 + len(g.token_ids))
            same = (used[pos].sort(-1).values == sampler[0, pos].sort(-1).values).all(-1)
            agree, total = agree + int(same.sum()), total + same.numel()
        out["replay" if replay else "default"] = agree / total
    return out


def _preset(preset: str, quick: bool, repeats: int) -> dict:
    return _measure(build_model(ModelConfig(preset=preset, max_seq_len=1024), vocab_size=VOCAB), preset == "tiny-moe",
                    quick, repeats)


def _measure(model, moe: bool, quick: bool, repeats: int) -> dict:
    prompts, params = workload(quick)
    engine_tps: dict[str, list[float]] = {"default": [], "batch_invariant": []}
    engine_cpu: dict[str, list[float]] = {"default": [], "batch_invariant": []}
    gens: dict[str, list[Generation]] = {}
    for _ in range(repeats):
        for mode in engine_tps:
            g, tps = serve(model, prompts, params, mode == "batch_invariant", engine_cpu[mode])
            engine_tps[mode].append(tps)
            gens.setdefault(mode, g)
    trajs = {m: trajectories(prompts, g) for m, g in gens.items()}
    runs = {"default": ("default", False, False), "batch_invariant": ("batch_invariant", False, True)}
    if moe:
        runs["router_replay"] = ("default", True, False)
    steps: dict[str, list[dict]] = {m: [] for m in runs}
    for _ in range(repeats):
        for mode, (src, replay, bi) in runs.items():
            steps[mode].append(trainer_step(model, trajs[src], replay, bi))
    modes = {}
    for mode, ms in steps.items():
        m = ms[0]
        modes[mode] = {
            "k3": m["mismatch/k3"], "max_abs_dlogp": m["mismatch/max_abs_diff"],
            "mean_abs_dlogp": m["mismatch/mean_abs_diff"],
            "own_topk_agreement": m.get("router_agreement"),
            "trainer_tokens_per_s": statistics.median(x["tokens_per_s"] for x in ms),
        }
    for mode in engine_tps:
        modes[mode]["engine_tokens_per_s"] = statistics.median(engine_tps[mode])
        modes[mode]["engine_tokens_per_cpu_s"] = statistics.median(engine_cpu[mode])
    if moe:
        for key in ("engine_tokens_per_s", "engine_tokens_per_cpu_s"):  # same engine
            modes["router_replay"][key] = modes["default"][key]
        used = _used_expert_agreement(model, prompts, gens["default"])
        modes["default"]["used_expert_agreement"] = used["default"]
        modes["router_replay"]["used_expert_agreement"] = used["replay"]
    base = modes["default"]
    for r in modes.values():
        r["engine_cost"] = 1 - r["engine_tokens_per_s"] / base["engine_tokens_per_s"]
        r["engine_cost_cpu"] = 1 - r["engine_tokens_per_cpu_s"] / base["engine_tokens_per_cpu_s"]
        r["trainer_cost"] = 1 - r["trainer_tokens_per_s"] / base["trainer_tokens_per_s"]
    result = {"modes": modes, "engine_tokens_per_s_runs": engine_tps, "engine_tokens_per_cpu_s_runs": engine_cpu,
              "trainer_tokens_per_s_runs": {m: [x["tokens_per_s"] for x in ms] for m, ms in steps.items()},
              "num_sessions": len(prompts), "num_generated_tokens": sum(len(g.token_ids) for g in gens["default"])}
    if moe:  # a bfloat16 sampler (as inference engines run) against the fp32 trainer: routing flips
        result["bf16_sampler"] = _replay_mismatch(model, prompts, params)  # random-init model
        result["bf16_sampler_trained"] = _trained_moe(quick, repeats)
    return result


def _run_model(model_dir: str, dtype: str, quick: bool, repeats: int) -> dict:
    """`--model DIR`: the default and batch-invariant modes on one dense model (float32: what the mode needs)."""
    model = load_model(model_dir, dtype)
    model.config.max_position_embeddings = min(model.config.max_position_embeddings, 1024)
    model.config.eos_token_id = None  # every session generates its full length, as on the presets
    measured = _measure(model, False, quick, repeats)
    modes = measured["modes"]
    summary = {"model": model_dir, "model_type": model.config.model_type, "dtype": dtype,
               "bi_max_abs_dlogp": modes["batch_invariant"]["max_abs_dlogp"],
               "bi_engine_cost": modes["batch_invariant"]["engine_cost"],
               "bi_trainer_cost": modes["batch_invariant"]["trainer_cost"],
               "k3_default": modes["default"]["k3"], "default_max_abs_dlogp": modes["default"]["max_abs_dlogp"],
               "quick": quick}
    return {"summary": summary, "model": measured}


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    repeats = 1 if quick else 5
    threads = torch.get_num_threads()
    load_start = os.getloadavg()
    if getattr(args, "model", None):
        result = _run_model(args.model, getattr(args, "dtype", None) or "float32", quick, 1 if quick else 3)
        result["summary"].update(load_avg_start=load_start, load_avg_end=os.getloadavg())
        return result
    torch.set_num_threads(1)
    try:
        presets = {p: _preset(p, quick, repeats) for p in ("tiny", "tiny-moe")}
    finally:
        torch.set_num_threads(threads)
    dense, moe = presets["tiny"]["modes"], presets["tiny-moe"]["modes"]
    k3_fp32 = moe["router_replay"]["k3"]
    trained, rand = presets["tiny-moe"]["bf16_sampler_trained"], presets["tiny-moe"]["bf16_sampler"]
    head32, head16 = trained["bf16_trainer_fp32_head"], trained["bf16_trainer"]
    summary = {
        "bi_max_abs_dlogp_dense": dense["batch_invariant"]["max_abs_dlogp"],
        "bi_max_abs_dlogp_moe": moe["batch_invariant"]["max_abs_dlogp"],
        "bi_engine_cost": max(dense["batch_invariant"]["engine_cost"], moe["batch_invariant"]["engine_cost"]),
        "bi_trainer_cost": max(dense["batch_invariant"]["trainer_cost"], moe["batch_invariant"]["trainer_cost"]),
        "bi_engine_cost_dense": dense["batch_invariant"]["engine_cost"],
        "bi_engine_cost_moe": moe["batch_invariant"]["engine_cost"],
        "bi_trainer_cost_dense": dense["batch_invariant"]["trainer_cost"],
        "bi_trainer_cost_moe": moe["batch_invariant"]["trainer_cost"],
        "default_max_abs_dlogp_dense": dense["default"]["max_abs_dlogp"],
        "default_max_abs_dlogp_moe": moe["default"]["max_abs_dlogp"],
        "default_k3_moe": moe["default"]["k3"],
        "bi_engine_cost_cpu": max(dense["batch_invariant"]["engine_cost_cpu"],
                                  moe["batch_invariant"]["engine_cost_cpu"]),
        "bi_engine_cost_cpu_dense": dense["batch_invariant"]["engine_cost_cpu"],
        "bi_engine_cost_cpu_moe": moe["batch_invariant"]["engine_cost_cpu"],
        "replay_expert_agreement": min(trained["router_replay"]["used_expert_agreement"],
                                       rand["router_replay"]["used_expert_agreement"]),
        "replay_k3_reduction_moe": head32["k3_reduction"],
        "k3_moe_bf16_free": head32["k3_default"],
        "k3_moe_bf16_replay": head32["k3_router_replay"],
        "routing_flip_frac_moe_fp32_head": head32["routing_flip_frac"],
        "replay_k3_reduction_moe_bf16_head": head16["k3_reduction"],
        "k3_moe_bf16_head_free": head16["k3_default"],
        "k3_moe_bf16_head_replay": head16["k3_router_replay"],
        "fp32_head_engine_cost_moe": trained["fp32_head_engine_cost"],
        "replay_k3_reduction_moe_fp32_trainer": trained["k3_reduction"],
        "k3_moe_bf16_sampler_fp32_trainer_free": trained["default"]["k3"],
        "k3_moe_bf16_sampler_fp32_trainer_replay": trained["router_replay"]["k3"],
        "routing_flip_frac_moe": trained["routing_flip_frac"],
        "replay_k3_reduction_moe_random_init": rand["k3_reduction"],
        "routing_flip_frac_moe_random_init": rand["routing_flip_frac"],
        "replay_k3_reduction_moe_fp32_sampler": moe["default"]["k3"] / k3_fp32 if k3_fp32 > 0 else None,
        "replay_trainer_cost_moe": moe["router_replay"]["trainer_cost"],
        "torch_threads": 1,
        "quick": quick,
        "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
    }
    return {"summary": summary, "presets": presets}
