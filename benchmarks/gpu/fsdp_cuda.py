"""The sharded trainer's checks on GPUs over NCCL (issue 25), prepared for a lent multi-GPU machine; never a test.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/fsdp_cuda.py --out fsdp_cuda.json [--preset small]
    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/fsdp_cuda.py --backend gloo --preset tiny   # CPU dry run

What it runs (the same properties tests/unit/test_sharded_trainer.py checks on CPU/gloo):

1. equality: N ranks (FSDP2 over NCCL, one GPU each) take three steps; rank 0 also runs the single-process
   Trainer on its GPU on the same batches; max |Δw| per step (bitwise is not expected on GPUs: cuBLAS picks its
   kernels by shape and the NCCL reduction order is its own; the CPU test states where it is bitwise);
2. resume: a DCP checkpoint after step 2, step 3 taken again after loading it, compared bitwise with the
   uninterrupted step 3 (set `torch.use_deterministic_algorithms(True)`; CUBLAS_WORKSPACE_CONFIG is set here);
3. publication: a sharded publish and an unsharded publish of the gathered weights give the same manifest;
4. figures: tokens/s per rank count, peak GPU memory per rank (`torch.cuda.max_memory_allocated`) and the
   parameter + gradient + optimizer bytes of the largest rank, publish seconds sharded vs gathered.

Bare machine: it imports flywheel from the working tree (`src/`) and needs torch, transformers, safetensors,
pydantic, zstandard, numba and fsspec (`pip install -e .` from the checkout provides them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402

from flywheel.bench.trainer import VOCAB, make_batch, settings  # noqa: E402
from flywheel.config import ModelConfig, TrainerConfig  # noqa: E402
from flywheel.policy.model import build_model  # noqa: E402
from flywheel.trainer.distributed import close_group, init_group, shard_model  # noqa: E402
from flywheel.trainer.train import Trainer  # noqa: E402
from flywheel.weights.sharded import ShardedPublisher  # noqa: E402
from flywheel.weights.store import WeightStore  # noqa: E402
from flywheel.weights.sync import Publisher  # noqa: E402


def full(model) -> dict:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="fsdp_cuda.json")
    p.add_argument("--preset", default="small")
    p.add_argument("--num-layers", type=int, default=0)
    p.add_argument("--backend", default="nccl", choices=["nccl", "gloo"], help="gloo: a CPU dry run of the script")
    a = p.parse_args()
    cuda = a.backend == "nccl"
    torch.use_deterministic_algorithms(True)
    ws = int(os.environ["WORLD_SIZE"])
    s = settings(quick=False)
    cfg = TrainerConfig(world_size=ws, lr=1e-5, micro_batch_tokens=s["micro_batch_tokens"], dist_backend=a.backend)
    group = init_group(cfg)
    mcfg = ModelConfig(preset=a.preset, num_layers=a.num_layers)
    tmp = Path(tempfile.mkdtemp(prefix="fsdp-cuda-")) if group.is_main else None
    tmp = Path(group.broadcast_object(str(tmp) if tmp else None))
    model = shard_model(build_model(mcfg, vocab_size=VOCAB), group, cfg)
    trainer = Trainer(model, cfg, run_dir=tmp / "run", group=group)
    ref = Trainer(build_model(mcfg, vocab_size=VOCAB).to(group.device), cfg.model_copy(update={"world_size": 1})) \
        if group.is_main else None
    batches = [make_batch(s, k) for k in range(3)]
    out: dict = {"world_size": ws, "device": torch.cuda.get_device_name(group.device) if cuda else "cpu",
                 "preset": a.preset, "steps": []}
    if cuda:
        torch.cuda.reset_peak_memory_stats(group.device)
    times, weights = [], {}
    for k, batch in enumerate(batches):
        if cuda:
            torch.cuda.synchronize()
        m = trainer.step(batch)
        times.append(m["step_time_s"])
        weights[k + 1] = full(model)
        if k == 1:
            trainer.save_checkpoint({"data_position": 2})
        if ref is not None:
            m1 = ref.step(batch)
            w1 = {n: t.cpu() for n, t in ref.model.state_dict().items()}
            diff = max(float((w1[n] - weights[k + 1][n]).abs().max()) for n in w1)
            out["steps"].append({"step": k + 1, "loss": m["loss"], "loss_1": m1["loss"], "max_abs_dw": diff,
                                 "tokens_per_s": m["tokens_per_s"], "tokens_per_s_1": m1["tokens_per_s"]})
    out["peak_gpu_bytes"] = group.all_gather_objects(torch.cuda.max_memory_allocated(group.device) if cuda else 0)
    out["state_bytes"] = group.all_gather_objects(trainer.state_bytes)
    out["tokens_per_s"] = m["num_tokens"] / statistics.median(times)

    again = Trainer(shard_model(build_model(mcfg, vocab_size=VOCAB), group, cfg), cfg, run_dir=tmp / "run",
                    group=group)
    again.load_checkpoint()
    again.step(batches[2])
    resumed = full(again.model)
    if group.is_main:
        out["resume_bitwise"] = all(torch.equal(resumed[n], weights[3][n]) for n in resumed)

    pub = ShardedPublisher(str(tmp / "sharded"), group, dtype="bfloat16")
    plain = Publisher(str(tmp / "gathered"), dtype="bfloat16") if group.is_main else None
    for version in (1, 2):
        if version == 2:
            trainer.step(batches[0])
        group.barrier()
        t0 = time.perf_counter()
        pub.publish(version, trainer.state_dict_for_publish())
        group.barrier()
        t_sharded = time.perf_counter() - t0
        t0 = time.perf_counter()
        gathered = full(model)
        if plain is not None:
            plain.publish(version, gathered)
            plain.flush()
        group.barrier()
        t_gathered = time.perf_counter() - t0
    if group.is_main:
        plain.close()
        a_m, b_m = (WeightStore(str(tmp / x)).read_manifest(2) for x in ("sharded", "gathered"))
        out["manifests_equal"] = {k: v for k, v in a_m.items() if k != "created_s"} == \
            {k: v for k, v in b_m.items() if k != "created_s"}
        out["publish_s_sharded"], out["publish_s_gathered"] = t_sharded, t_gathered
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out, indent=2))
    pub.close()
    close_group()


if __name__ == "__main__":
    main()
