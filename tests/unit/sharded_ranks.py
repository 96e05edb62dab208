"""One rank of the 2-rank scenarios in test_sharded_trainer.py (started by torchrun, never collected by pytest).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/unit/sharded_ranks.py train OUT
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/unit/sharded_ranks.py resume OUT

`train`: FSDP2 on the tiny model, three steps on the batches of `batches()`, a sharded checkpoint after step 2,
a sharded publish of every version; rank 0 writes the metrics and the full weights after every step (gathered
for the test's comparison only). `resume`: a fresh group loads the step-2 checkpoint and takes step 3 again; a
single-process checkpoint (OUT/single_run, written by the test) is loaded into the group and step 2 taken; then
one step of the tiny MoE with the sampler's routing replayed (`moe_batch()`); step 1 with packed sequences; step 1
with activation checkpointing; then one step in batch-invariant mode on the engine's trajectories (OUT/bi_batch.json,
written by the test with `engine_batch()`): rank 0 writes the trainer's recomputed log-probs and the weights.
"""

import asyncio
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from flywheel.config import ModelConfig, TrainerConfig
from flywheel.inference.local import LocalEngine
from flywheel.policy.model import build_model
from flywheel.trainer.distributed import init_group, leave_group, local_state_bytes, shard_model
from flywheel.trainer.replay import record_routing
from flywheel.trainer.train import Trainer
from flywheel.types import Reward, SamplingParams, Segment, Trajectory
from flywheel.weights.sharded import ShardedPublisher

VOCAB = 64
CHUNK_MB = 0.004  # 4 KiB chunks: most tensors span several chunks and some straddle the shard boundary


def trainer_config(world_size: int, step: int) -> TrainerConfig:
    # step 1: a budget that packs the batch into exactly 2 micro-batches (one per rank), clipping off;
    # steps 2-3: 3 micro-batches (2 on one rank, 1 + a filler on the other), clipping on
    if step == 1:
        return TrainerConfig(world_size=world_size, lr=1e-3, grad_clip=0.0, micro_batch_tokens=60)
    return TrainerConfig(world_size=world_size, lr=1e-3, grad_clip=1.0, micro_batch_tokens=30)


def model():
    return build_model(ModelConfig(preset="tiny", num_layers=2, seed=3), vocab_size=VOCAB)


def batches() -> list[list[Trajectory]]:
    """Three batches of 8 trajectories (2 groups of 4), sampler log-probs drawn at random (off-policy)."""
    g = torch.Generator().manual_seed(7)
    out = []
    for step in range(3):
        batch = []
        for k in range(2):
            prompt = torch.randint(3, VOCAB, (4 + k,), generator=g).tolist()
            for j in range(4):
                comp = torch.randint(3, VOCAB, (2 + j + step,), generator=g).tolist()
                lp = (-0.5 - 3 * torch.rand(len(comp), generator=g)).tolist()
                ids = prompt + comp
                seg = Segment(token_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(comp),
                              logprobs=[0.0] * len(prompt) + lp, versions=[-1] * len(prompt) + [0] * len(comp))
                batch.append(Trajectory(task_id=f"t{k}", group_id=f"s{step}g{k}", segments=[seg],
                                        reward=Reward(value=float((j + k) % 2))))
        out.append(batch)
    return out


def moe_model():
    return build_model(ModelConfig(preset="tiny-moe", num_layers=2, seed=5), vocab_size=VOCAB)


def moe_batch() -> list[Trajectory]:
    """The first batch with routed experts: the routing a (slightly perturbed) sampler chose, so the replay
    overrides some of the trainer's own top-k."""
    sampler = moe_model()
    with torch.no_grad():
        for p in sampler.parameters():
            p.add_(0.002 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    out = []
    for traj in batches()[0]:
        seg = traj.segments[0]
        with torch.no_grad(), record_routing(sampler) as rec:
            sampler(torch.tensor([seg.token_ids]))
        e = rec.experts()
        seg.routed_experts = [[] if not m or i == 0 else e[i - 1].tolist() for i, m in enumerate(seg.loss_mask)]
        out.append(traj)
    return out


def bi_config(world_size: int) -> TrainerConfig:
    """Batch-invariant step: a budget that packs the 8 sessions of `engine_batch()` into 2 micro-batches."""
    return TrainerConfig(world_size=world_size, lr=1e-3, grad_clip=0.0, micro_batch_tokens=200)


def engine_batch() -> list[Trajectory]:
    """8 sessions sampled by the engine in batch-invariant mode (prompts of 3-20 tokens, 6-13 new tokens, all
    in one engine batch), as trajectories whose sampler log-probs the trainer must reproduce bit for bit."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, VOCAB, (int(torch.randint(3, 21, (1,), generator=g)),), generator=g).tolist()
               for _ in range(8)]
    params = [SamplingParams(temperature=1.0, max_new_tokens=6 + i, seed=i) for i in range(8)]

    async def sample():
        async with LocalEngine(model(), batch_invariant=True) as engine:
            return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))

    out = []
    for i, (p, gen) in enumerate(zip(prompts, asyncio.run(sample()))):
        seg = Segment(token_ids=p + gen.token_ids, loss_mask=[0] * len(p) + [1] * len(gen.token_ids),
                      logprobs=[0.0] * len(p) + gen.logprobs, versions=[-1] * len(p) + gen.versions)
        out.append(Trajectory(task_id="t", group_id=f"bi{i % 2}", segments=[seg], reward=Reward(value=float(i % 3 == 0))))
    return out


def full_weights(m) -> dict:
    sd = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.clone().contiguous() for k, v in sd.items()}


def main(phase: str, out: Path) -> None:
    torch.set_num_threads(1)
    cfg = trainer_config(2, 1)
    group = init_group(cfg)
    m = shard_model(model(), group, cfg)
    trainer = Trainer(m, cfg, run_dir=out / "run", group=group)
    pub = ShardedPublisher(str(out / f"store_{phase}"), group, anchor_every=2, chunk_mb=CHUNK_MB, dtype="bfloat16",
                           num_threads=1)
    data = batches()
    first = 0
    if phase == "resume":
        trainer.load_checkpoint()
        first = trainer.version
    records = []
    for step in range(first, 3):
        trainer.cfg = trainer_config(2, step + 1)
        metrics = trainer.step(data[step])
        pub_metrics = pub.publish(trainer.version, trainer.state_dict_for_publish())
        full = full_weights(m)
        if group.is_main:
            save_file(full, out / f"{phase}_weights_{trainer.version}.safetensors")
        records.append({"version": trainer.version, "metrics": metrics, "publish": pub_metrics,
                        "state_bytes": local_state_bytes(m, trainer.optimizer)})
        if phase == "train" and trainer.version == 2:
            trainer.save_checkpoint({"admitted": ["s0g0", "s1g1"], "data_position": 2})
    if phase == "resume":  # a single-process checkpoint (written by the test) into a 2-rank group, then step 2
        grown = Trainer(shard_model(model(), group, cfg), trainer_config(2, 2), run_dir=out / "single_run",
                        group=group)
        grown.load_checkpoint()
        grown.step(data[1])
        full = full_weights(grown.model)
        if group.is_main:
            save_file(full, out / "grown_weights_2.safetensors")
    if phase == "resume":  # router replay, sharded: one step of the MoE on 2 micro-batches (one per rank)
        moe = shard_model(moe_model(), group, cfg)
        moe_trainer = Trainer(moe, trainer_config(2, 1), group=group)
        metrics = moe_trainer.step(moe_batch())
        full = full_weights(moe)
        if group.is_main:
            save_file(full, out / "moe_weights_1.safetensors")
        records.append({"version": 1, "metrics": metrics, "moe": True})
        # packed sequences: step 1 packs into 2 sequences, one per rank
        pk_cfg = trainer_config(2, 1).model_copy(update={"pack_sequences": True})
        pk = shard_model(model(), group, pk_cfg)
        pk_metrics = Trainer(pk, pk_cfg, group=group).step(data[0])
        full = full_weights(pk)
        if group.is_main:
            save_file(full, out / "packed_weights_1.safetensors")
        records.append({"version": 1, "metrics": pk_metrics, "packed": True})
        # activation checkpointing recomputes the same ops: step 1 must give the same bits as without it
        ac_cfg = trainer_config(2, 1).model_copy(update={"activation_checkpointing": True})
        ac = shard_model(model(), group, ac_cfg)
        Trainer(ac, ac_cfg, group=group).step(data[0])
        full = full_weights(ac)
        if group.is_main:
            save_file(full, out / "ac_weights_1.safetensors")
    if phase == "resume" and (out / "bi_batch.json").exists():  # batch-invariant mode, sharded
        bi_batch = [Trajectory.from_dict(d) for d in json.loads((out / "bi_batch.json").read_text())]
        bi = shard_model(model(), group, bi_config(2))
        bi_trainer = Trainer(bi, bi_config(2), group=group, batch_invariant=True)
        bi_metrics = bi_trainer.step(bi_batch)
        recomputed = [bi_trainer.recomputed_logprobs(i) for i in range(len(bi_batch))]
        full = full_weights(bi)
        if group.is_main:
            save_file(full, out / "bi_weights_1.safetensors")
            (out / "bi_recomputed.json").write_text(json.dumps(recomputed))
        records.append({"version": 1, "metrics": bi_metrics, "batch_invariant": True})
    every = group.all_gather_objects(records)
    if group.is_main:
        (out / f"{phase}.json").write_text(json.dumps(every))
    pub.close()
    leave_group(group)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
