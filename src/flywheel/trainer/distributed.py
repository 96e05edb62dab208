"""The sharded trainer's plumbing: process group and mesh, FSDP2 wrapping, micro-batch assignment, collectives.

    group = init_group(cfg.trainer)                        # under torchrun (env://), or init_method/rank/world_size
    model = shard_model(model, group, cfg.trainer)         # fully_shard per decoder layer, then the root
    trainer = Trainer(model, cfg.trainer, run_dir, group=group)   # same step(), every rank gets the whole batch
    torchrun --nproc-per-node 2 -m flywheel.trainer.launch RUN_DIR ...   # what the local backend starts (launch.py)

Why it is built so:

* **FSDP2 per decoder layer** (`fully_shard` on each layer, then on the root for the embedding, the final norm
  and the tied head): a layer's parameters are all-gathered just before its forward and freed after it, gradients
  are reduce-scattered as each layer's backward ends, and AdamW steps only the local shard. Per rank, parameters,
  gradients and optimizer state are 1/world_size of the model, plus one unsharded layer at a time.
* **Gradients are summed, not averaged**: the loss already carries the batch-global denominators
  (trainer/losses.py), so the sum over ranks of the per-rank gradients is the gradient of the whole batch, as on
  one device. FSDP2 averages over ranks (a custom divide factor needs NCCL's PREMUL_SUM, which gloo lacks), so
  the trainer multiplies each rank's loss by `world_size` (`loss_scale`); for a power-of-two world size the
  scaling and FSDP's division are exact.
* **Mixed precision** (`trainer.dtype = "bfloat16"`): parameters are cast to bf16 for compute, gradients are
  reduced in fp32 and the fp32 master shard is what AdamW updates (MixedPrecisionPolicy). No autocast.
* **Micro-batches are packed once, globally, then dealt to ranks by tokens** (longest-processing-time first, so
  the padded tokens per rank differ by at most one micro-batch). The packing does not depend on the world size,
  so every rank computes the very same micro-batches a single device would; a rank with fewer micro-batches
  runs zero-weight filler forwards, because every FSDP forward and backward is a collective all ranks must join.
* **Batch-invariant mode** (`numerics.batch_invariant`) runs the engine's own math (modeling/batch_invariant.py)
  instead of the HF forward; FSDP's hooks are registered on its per-layer block (`register_batch_invariant`), so
  each block sees its layer's whole parameters, all-gathered exactly. A row's log-probs then do not depend on the
  rank or micro-batch that holds it (docs/training.md, "Batch invariance across ranks").
* **Objects and small tensors travel on a gloo group** (the default group on CPU; a second one beside NCCL), so
  the batch, old log-probs and metrics never need a device copy.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from flywheel.config import TrainerConfig
from flywheel.modeling.batch_invariant import LAYER_METHOD, MODEL_METHOD
from flywheel.trainer.lora import apply_lora

MESH_DIMS = ("dp_shard",)  # tensor and expert parallel would add dimensions here (config.MeshConfig)


@dataclass
class RankGroup:
    """This process's place in the trainer group: rank, mesh, and a gloo group for objects and CPU tensors."""

    rank: int
    world_size: int
    mesh: DeviceMesh
    cpu_group: Any  # a ProcessGroup (gloo)
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks of a CPU tensor; returns it."""
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.cpu_group)
        return t

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.cpu_group)
        return box[0]

    def gather_objects(self, obj: Any, dst: int = 0) -> list[Any] | None:
        out = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst, group=self.cpu_group)
        return out

    def all_gather_objects(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)


def resolve_backend(name: str) -> str:
    if name == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if name == "nccl" and not torch.cuda.is_available():
        raise ValueError("trainer.dist_backend = 'nccl' needs CUDA devices; use 'gloo' (or 'auto') on CPU")
    return name


def init_group(cfg: TrainerConfig, *, init_method: str | None = None, rank: int | None = None,
               world_size: int | None = None) -> RankGroup:
    """Join (or reuse) the default process group and build the mesh. Under torchrun the rank, world size and
    rendezvous come from the environment; tests pass `init_method="file://..."`, `rank` and `world_size`."""
    backend = resolve_backend(cfg.dist_backend)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=cfg.dist_timeout_s)}
        if init_method is not None:
            kwargs.update(init_method=init_method, rank=rank, world_size=world_size)
        dist.init_process_group(backend, **kwargs)
    ws, r = dist.get_world_size(), dist.get_rank()
    if ws != cfg.world_size:
        raise ValueError(f"the process group has {ws} ranks but trainer.world_size = {cfg.world_size}; launch as many "
                         "ranks as the config names (torchrun --nproc-per-node) or change trainer.world_size")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", r % max(torch.cuda.device_count(), 1))))
        torch.cuda.set_device(device)
        cpu_group = dist.new_group(backend="gloo")
    else:
        device = torch.device("cpu")
        cpu_group = dist.group.WORLD
    mesh = init_device_mesh(device.type, (ws,), mesh_dim_names=MESH_DIMS)
    return RankGroup(r, ws, mesh, cpu_group, device)


def close_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def leave_group(group: RankGroup) -> None:
    """Every rank meets the others once more, then leaves the process group. No rank exits while another is still
    inside a collective, and gloo's connections close in order: a rank that exits first can make a slower one's
    teardown fail ("terminate called without an active exception"), and torchrun then reports the whole group as
    failed."""
    group.barrier()
    close_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of an HF causal LM (`model.model.layers`), the unit FSDP shards and gathers."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not len(layers):
        raise ValueError(f"{type(model).__name__} has no `model.layers`; the sharded trainer wraps HF decoder "
                         "layers (Qwen3, Qwen3-MoE, Llama-style models)")
    return list(layers)


def shard_model(model: torch.nn.Module, group: RankGroup, cfg: TrainerConfig) -> torch.nn.Module:
    """FSDP2 over `group.mesh`: each decoder layer, then the root (embedding, final norm, tied head).
    The model must be on the CPU (or its device) with identical weights on every rank; returns it, sharded."""
    if cfg.lora.rank > 0:  # adapters before sharding: FSDP then shards the frozen base and the adapters together
        apply_lora(model, cfg.lora, cfg.seed)
    if cfg.activation_checkpointing:  # before sharding: recompute wraps each layer call in torch.utils.checkpoint
        model.gradient_checkpointing_enable(  # type: ignore[operator]  # a transformers PreTrainedModel
            gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(group.device)
    mp = None
    if cfg.dtype == "bfloat16":  # bf16 compute, fp32 reduction, fp32 master weights in the optimizer
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs: dict[str, Any] = {"mesh": group.mesh}
    if mp is not None:
        kwargs["mp_policy"] = mp
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    assert isinstance(model, FSDPModule)
    return model


def register_batch_invariant(model: torch.nn.Module) -> None:
    """Batch-invariant mode on a sharded model (after `BatchInvariantForward(model)` set its methods): FSDP runs
    its forward hooks around each decoder layer's block and around the whole forward, as around `forward`: the
    layer's parameters are all-gathered (an exact copy of every shard) just before its block and freed after it,
    gathered again for its backward, and its gradients reduce-scattered when that backward ends."""
    for layer in decoder_layers(model):
        register_fsdp_forward_method(layer, LAYER_METHOD)
    register_fsdp_forward_method(model, MODEL_METHOD)


def loss_scale(group: RankGroup | None) -> float:
    """Factor on each rank's loss that turns FSDP's mean over ranks into the sum the global denominators need."""
    return 1.0 if group is None else float(group.world_size)


def assign_micro_batches(costs: list[int], world_size: int) -> list[list[int]]:
    """Micro-batch indices per rank, balanced by cost (padded tokens): the largest first, each to the rank with
    the least so far (ties: lower rank). Each rank's list is in ascending index order. Pure and deterministic,
    so every rank computes the same assignment."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    load = [0] * world_size
    out: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world_size), key=lambda r: (load[r], len(out[r]), r))
        out[r].append(i)
        load[r] += costs[i]
    return [sorted(x) for x in out]


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds of parameters, gradients and optimizer state (local shards of DTensors)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    seen: dict[int, torch.nn.Parameter] = {id(p): p for p in model.parameters()}
    params = sum(local(p).numel() * local(p).element_size() for p in seen.values())
    grads = sum(local(p.grad).numel() * local(p.grad).element_size() for p in seen.values() if p.grad is not None)
    opt = 0
    if optimizer is not None:
        for st in optimizer.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    lv = local(v)
                    opt += lv.numel() * lv.element_size()
    return {"param_bytes": params, "grad_bytes": grads, "optimizer_bytes": opt, "total_bytes": params + grads + opt}
