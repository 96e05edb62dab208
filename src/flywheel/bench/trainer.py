"""Benchmark the sharded trainer at 1 and 2 ranks: `flywheel bench trainer --ranks 1,2 --out FILE [--quick]`.

For each rank count W the bench starts `torchrun --standalone --nproc-per-node W` on this module (W = 1 is the
plain single-process Trainer, the baseline; W > 1 is FSDP2 over gloo) and each rank measures, on the same model
and the same GRPO batches of synthetic trajectories (random tokens and sampler log-probs, one rewarded session
per pair):

* `tokens_per_s`: batch tokens over the median step time of `num_steps` steps after one warm-up step;
* `state_bytes`: this rank's parameter + gradient + AdamW bytes at their peak in a step (`Trainer.state_bytes`,
  local shards) - `mem_per_rank_ratio_W` is the largest rank's figure at W over the figure at 1;
* `publish_s_sharded`: one delta version published by every rank's own shards (weights/sharded.py);
  `publish_s_gathered`: the same version published the way a trainer without sharded publication must - the full
  state dict gathered to rank 0 (`get_model_state_dict(full_state_dict=True)`), then the unsharded Publisher;
  each into a fresh store after a first (anchor) version, best of `num_publish`;
* `manifests_equal`: the two stores' manifests of that version match entry for entry.

Why torchrun even for W = 1: every figure comes from a fresh process started the same way, so import and
allocator state do not favour either side. Threads: one torch thread per rank (on 2 cores, W = 2 uses both).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.policy.model import build_model, num_parameters
from flywheel.trainer.distributed import close_group, init_group, leave_group, shard_model
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, Segment, Trajectory
from flywheel.weights.sharded import ShardedPublisher
from flywheel.weights.store import WeightStore
from flywheel.weights.sync import Publisher

VOCAB = 2048


def settings(quick: bool) -> dict:
    if quick:
        return dict(preset="tiny", num_layers=2, num_trajectories=8, prompt=32, completion=96, num_steps=2,
                    micro_batch_tokens=1024, chunk_mb=0.25, num_publish=2)
    return dict(preset="small", num_layers=4, num_trajectories=16, prompt=64, completion=192, num_steps=3,
                micro_batch_tokens=2048, chunk_mb=1.0, num_publish=3)


def make_batch(s: dict, step: int) -> list[Trajectory]:
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for i in range(s["num_trajectories"]):
        ids = torch.randint(3, VOCAB, (s["prompt"] + s["completion"],), generator=g).tolist()
        lp = (-1.0 - 4 * torch.rand(s["completion"], generator=g)).tolist()
        seg = Segment(token_ids=ids, loss_mask=[0] * s["prompt"] + [1] * s["completion"],
                      logprobs=[0.0] * s["prompt"] + lp, versions=[-1] * s["prompt"] + [0] * s["completion"])
        out.append(Trajectory(task_id=f"t{i // 2}", group_id=f"g{step}-{i // 2}", segments=[seg],
                              reward=Reward(value=float(i % 2))))
    return out


def rank_main(world_size: int, quick: bool, out_dir: Path) -> None:
    """One rank of one measurement (run by torchrun)."""
    torch.set_num_threads(1)
    s = settings(quick)
    cfg = TrainerConfig(world_size=world_size, lr=1e-5, micro_batch_tokens=s["micro_batch_tokens"])
    model: torch.nn.Module = build_model(ModelConfig(preset=s["preset"], num_layers=s["num_layers"]), vocab_size=VOCAB)
    group = init_group(cfg) if world_size > 1 else None
    if group is not None:
        model = shard_model(model, group, cfg)
    trainer = Trainer(model, cfg, group=group)
    times: list[float] = []
    tokens = 0.0
    for step in range(s["num_steps"] + 1):
        m = trainer.step(make_batch(s, step))
        if step:
            times.append(m["step_time_s"])
            tokens = m["num_tokens"]
    state = dict(trainer.state_bytes)
    result = {"rank": 0 if group is None else group.rank, "step_time_s": statistics.median(times),
              "tokens_per_s": tokens / statistics.median(times), "state_bytes": state}
    if group is not None:
        result.update(_publish_figures(trainer, group, s, out_dir))
        results = group.gather_objects(result)
    else:
        results = [result]
    if group is None or group.is_main:
        (out_dir / f"ranks_{world_size}.json").write_text(json.dumps(results))
    if group is None:
        close_group()
    else:
        leave_group(group)


def _publish_figures(trainer: Trainer, group, s: dict, out_dir: Path) -> dict:
    """Best-of-N seconds for one delta version: sharded, and gathered to rank 0 then published unsharded."""
    sharded_s, gathered_s, equal = [], [], True
    batch = make_batch(s, 99)
    for k in range(s["num_publish"]):
        root = out_dir / f"pub{k}"
        sharded = ShardedPublisher(str(root / "sharded"), group, chunk_mb=s["chunk_mb"], dtype="bfloat16",
                                   num_threads=1)
        plain = Publisher(str(root / "gathered"), chunk_mb=s["chunk_mb"], dtype="bfloat16", num_threads=1) \
            if group.is_main else None
        for version in (1, 2):  # 1: the anchor; 2: the delta that is timed
            if version == 2:
                trainer.step(batch)
            group.barrier()
            t0 = time.perf_counter()
            sharded.publish(version, trainer.state_dict_for_publish())
            group.barrier()
            t_sharded = time.perf_counter() - t0
            t0 = time.perf_counter()
            full: dict[str, Any] = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
            if plain is not None:
                plain.publish(version, full)
                plain.flush()
            del full
            group.barrier()
            t_gathered = time.perf_counter() - t0
        sharded_s.append(t_sharded)
        gathered_s.append(t_gathered)
        if plain is not None:
            plain.close()
            a = WeightStore(str(root / "sharded")).read_manifest(2)
            b = WeightStore(str(root / "gathered")).read_manifest(2)
            equal = equal and {k: v for k, v in a.items() if k != "created_s"} == \
                {k: v for k, v in b.items() if k != "created_s"}
        exchange = sharded.metrics[-1]["exchange_bytes"]
        sharded.close()
    return {"publish_s_sharded": min(sharded_s), "publish_s_gathered": min(gathered_s), "manifests_equal": equal,
            "exchange_bytes": exchange}


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    ranks = [int(x) for x in (getattr(args, "ranks", None) or "1,2").split(",")]
    if 1 not in ranks or any(r < 1 for r in ranks):
        raise ValueError("--ranks must list 1 (the baseline) and the rank counts to compare, e.g. --ranks 1,2")
    s = settings(quick)
    model = build_model(ModelConfig(preset=s["preset"], num_layers=s["num_layers"]), vocab_size=VOCAB)
    per: dict[int, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-trainer-") as tmp:
        for w in ranks:
            out = Path(tmp) / f"w{w}"
            out.mkdir()
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(w),
                   "-m", "flywheel.bench.trainer", "--world-size", str(w), "--out-dir", str(out)] + \
                (["--quick"] if quick else [])
            env = dict(os.environ, OMP_NUM_THREADS="1")
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"bench trainer at {w} ranks failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
            per[w] = json.loads((out / f"ranks_{w}.json").read_text())
            per[w][0]["wall_s"] = time.perf_counter() - t0
    base = per[1][0]
    summary = {"tokens_per_s_1": base["tokens_per_s"]}
    for w in ranks:
        if w == 1:
            continue
        summary[f"tokens_per_s_{w}"] = per[w][0]["tokens_per_s"]
        summary[f"scaling_{w}"] = per[w][0]["tokens_per_s"] / base["tokens_per_s"]
        summary[f"mem_per_rank_ratio_{w}"] = (max(r["state_bytes"]["total_bytes"] for r in per[w])
                                              / base["state_bytes"]["total_bytes"])
        summary[f"publish_s_sharded_{w}"] = per[w][0]["publish_s_sharded"]
        summary[f"publish_s_gathered_{w}"] = per[w][0]["publish_s_gathered"]
        summary[f"manifests_equal_{w}"] = per[w][0]["manifests_equal"]
    top = max(ranks)
    if top > 1:
        summary["publish_s_sharded"] = summary[f"publish_s_sharded_{top}"]
        summary["publish_s_gathered"] = summary[f"publish_s_gathered_{top}"]
    return {"summary": summary, "per_rank_count": {str(w): v for w, v in per.items()},
            "config": {**s, "ranks": ranks, "num_parameters": num_parameters(model), "publish_dtype": "bfloat16",
                       "torch_threads_per_rank": 1, "backend": "gloo"},
            "command": "flywheel bench trainer --ranks " + ",".join(map(str, ranks)) + (" --quick" if quick else "")}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="one rank of `flywheel bench trainer` (started by torchrun)")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    rank_main(a.world_size, a.quick, Path(a.out_dir))
