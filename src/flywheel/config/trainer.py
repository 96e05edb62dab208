"""Config sections of the trainer (`[trainer]`, `[trainer.lora]`, `[trainer.mesh]`; docs/training.md): the policy
optimisation, its low-rank adapters and its device mesh."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flywheel.config.base import Section
from flywheel.config.machine import bf16_matmul_available


class MeshConfig(Section):
    """The trainer's device mesh (trainer/distributed.py). Only data-parallel sharding (FSDP2) is built; the other
    dimensions are named so that configs written for tensor and expert parallelism fail clearly today."""

    dp_shard: int = Field(-1, ge=-1, le=65_536, description="ranks each parameter, gradient and optimizer state is "
                          "sharded over (FSDP2); -1 = all of trainer.world_size")
    tp: int = Field(1, ge=1, le=65_536, description="tensor-parallel degree; reserved: only 1 is built, any other "
                    "value is refused")
    ep: int = Field(1, ge=1, le=65_536, description="expert-parallel degree; reserved: only 1 is built, any other "
                    "value is refused")

    @model_validator(mode="after")
    def _check_reserved(self) -> MeshConfig:
        for name, what in (("tp", "tensor"), ("ep", "expert")):
            if getattr(self, name) != 1:
                raise ValueError(f"trainer.mesh.{name} = {getattr(self, name)}: {what} parallelism is reserved in the "
                                 f"config but not built; the sharded trainer shards data-parallel only (FSDP2 over "
                                 f"trainer.world_size ranks). Set trainer.mesh.{name} = 1 (docs/training.md)")
        return self


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Section):
    """Low-rank adapters (trainer/lora.py, peft): the base weights stay frozen, the optimizer holds only the
    adapters, and a version published to the engines is the adapter alone (docs/training.md, "LoRA")."""

    rank: int = Field(0, ge=0, le=4096, description="adapter rank r; 0 = off (full fine-tuning)")
    alpha: float = Field(16.0, gt=0, le=65_536, description="LoRA alpha; the update is (alpha / rank) * B @ A")
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), description="name suffixes of "
                                      "the nn.Linear modules that get an adapter (default: attention and MLP "
                                      "projections)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input while training")
    serve: Literal["merged", "unmerged"] = Field(
        "merged", description="how engines serve the adapter: merged into the base weights (W0 + scale B A, no cost "
        "per token), or unmerged beside them (x W0^T + scale (x A^T) B^T per adapted linear, as peft computes it; "
        "the native runner only); the trainer's batch-invariant path computes the same (modeling/lora.py)")

    @model_validator(mode="after")
    def _check_targets(self) -> LoraConfig:
        if self.rank > 0 and not self.target_modules:
            raise ValueError("trainer.lora.target_modules is empty; name at least one module suffix such as "
                             "'q_proj', or set trainer.lora.rank = 0")
        bad = [t for t in self.target_modules if not t or not all(part.isidentifier() for part in t.split("."))]
        if bad:
            raise ValueError(f"trainer.lora.target_modules entries {bad} are not module name suffixes such as "
                             "'q_proj' or 'self_attn.q_proj'")
        return self

    @property
    def scale(self) -> float:
        """alpha / rank: the factor on B @ A."""
        return self.alpha / self.rank if self.rank else 0.0


class TrainerConfig(Section):
    """Policy optimisation: advantages, loss, off-policy correction, optimizer, checkpoints, sharding."""

    lr: float = Field(1e-5, gt=0, le=1, description="AdamW learning rate")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, description="trainer steps of linear learning-rate warmup (then constant); "
                              "0 = off")
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0 = off")
    batch_size: int = Field(32, ge=1, description="trajectories per trainer step")
    micro_batch_tokens: int = Field(4096, ge=16, description="token budget per forward/backward")
    pack_sequences: bool = Field(False, description="concatenate rows into one sequence per micro-batch (positions "
                                 "restart per row, block-diagonal attention; trainer/packing.py) instead of padding "
                                 "rows to the longest")
    num_steps: int = Field(20, ge=0, description="trainer steps to run")
    update_epochs: int = Field(1, ge=1, le=64, description="optimizer steps per batch (PPO epochs): each pass over "
                               "the same trajectories, the clip bounding the move from the batch's old log-probs; "
                               "one published weight version per batch")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="training compute dtype; auto = bfloat16 where the machine has bf16 matmul units "
        "(an NVIDIA GPU, AMX-bf16 or AVX512-bf16 CPUs), else float32; resolved when the config loads")
    matmul_precision: Literal["bf16", "fp8_tensor", "fp8_block"] = Field(
        "bf16", description="inputs and weights of every decoder nn.Linear fake-quantized to fp8 e4m3 in the forward "
        "(per-tensor or 1 x 128 block scales, current scaling; straight-through gradients; trainer/precision.py); "
        "master weights and optimizer state unchanged; bf16 = trainer.dtype as is")
    advantage: Literal["grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "given"] = Field(
        "grpo", description="advantage estimator: group-relative (grpo, drgrpo, rloo: leave-one-out baseline), "
                            "REINFORCE++ (reinforce_pp: rewards whitened over the batch's loss tokens; "
                            "reinforce_pp_baseline: group mean subtracted, then whitened), or 'given' (the reward is "
                            "the advantage; the online learner subtracts its own running baseline); "
                            "trainer/advantages.py")
    negative_weight: float = Field(1.0, ge=0, le=1, description="scale of negative advantages (1 = as published, "
                                   "0 = only sessions that beat their group; see trainer/advantages.py)")
    clip_eps_low: float = Field(0.2, ge=0, le=1, description="PPO clip below 1")
    clip_eps_high: float = Field(0.28, ge=0, le=10, description="PPO clip above 1 (clip-higher)")
    loss: Literal["ppo", "dual_clip", "gspo", "gspo_token", "cispo", "sapo"] = Field(
        "ppo", description="policy-gradient surrogate per token (trainer/losses.py): ppo (clipped ratio), dual_clip "
                           "(ppo, negative advantages bounded by clip_ratio_c), gspo / gspo_token (sequence-level "
                           "ratio, clip gspo_clip_eps_*), cispo (clipped IS weight without gradient times log-prob, "
                           "clip_eps_*), sapo (sigmoid-gated ratio, sapo_tau_*)")
    clip_ratio_c: float = Field(3.0, gt=1, le=100, description="dual_clip: a negative-advantage token's loss is at "
                                "most clip_ratio_c * |A| (verl's default 3)")
    gspo_clip_eps_low: float = Field(3e-4, ge=0, le=1, description="gspo/gspo_token: clip of the sequence ratio "
                                     "below 1 (the GSPO paper's 3e-4)")
    gspo_clip_eps_high: float = Field(4e-4, ge=0, le=10, description="gspo/gspo_token: clip of the sequence ratio "
                                      "above 1 (the GSPO paper's 4e-4)")
    sapo_tau_pos: float = Field(1.0, gt=0, le=100, description="sapo: gate temperature of tokens with A > 0")
    sapo_tau_neg: float = Field(1.05, gt=0, le=100, description="sapo: gate temperature of tokens with A <= 0")
    correction: Literal["none", "tis", "tis_seq", "mis", "icepop"] = Field(
        "tis", description="off-policy correction against sampler log-probs")
    tis_cap: float = Field(2.0, gt=0, description="truncation cap C for importance weights")
    icepop_alpha: float = Field(0.5, gt=0, le=1, description="IcePop: mask tokens with ratio below this")
    icepop_beta: float = Field(2.0, ge=1, description="IcePop: mask tokens with ratio above this")
    kl_coef: float = Field(0.0, ge=0, description="weight of KL to the reference policy; 0 = off")
    kl_estimator: Literal["k3", "k3_clamp"] = Field(
        "k3", description="KL estimator per token: k3 (Schulman), or k3_clamp (verl's low_var_kl: log-ratio clamped "
                          "to [-20, 20], the estimate to [-10, 10])")
    aggregation: Literal["token_mean", "seq_mean", "token_sum"] = Field(
        "token_mean", description="loss aggregation; 'token_sum' divides by a constant (Dr.GRPO, see norm_tokens)")
    norm_tokens: int = Field(1024, ge=1, description="constant divisor per sequence for aggregation 'token_sum' (tokens)")
    keep_checkpoints: int = Field(3, ge=0, description="newest checkpoints kept on disk; 0 = keep all")
    checkpoint_every: int = Field(10, ge=0, description="trainer steps between checkpoints; 0 = only at the end")
    router_replay: bool = Field(True, description="MoE: trainer forward uses the sampler's routed experts")
    seed: int = Field(0, ge=0, description="trainer RNG seed; default: the global seed")
    world_size: int = Field(1, ge=1, le=65_536, description="trainer ranks (processes, one per device); > 1 shards "
                            "the model with FSDP2 over torch.distributed (torchrun locally, a Ray actor group on "
                            "Ray; docs/training.md, \"Sharded trainer\")")
    mesh: MeshConfig = Field(default_factory=MeshConfig, description="device mesh of the sharded trainer")
    activation_checkpointing: bool = Field(False, description="sharded trainer: recompute each decoder layer's "
                                           "activations in backward (less memory, ~1 more forward)")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="torch.distributed backend; auto = "
                                                          "nccl with CUDA, else gloo")
    dist_timeout_s: float = Field(300.0, gt=0, le=86_400, description="seconds a collective may wait for a peer "
                                  "before the group fails (a dead rank is noticed at the latest then)")
    group_max_restarts: int = Field(3, ge=0, le=1000, description="sharded trainer: restarts of a failed rank group "
                                    "(each resumes from the newest checkpoint)")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="low-rank adapters ([trainer.lora]); rank 0 "
                             "= off")

    @model_validator(mode="after")
    def _resolve_dtype(self) -> TrainerConfig:
        if self.dtype == "auto":  # the run's config.json records what ran
            self.dtype = "bfloat16" if bf16_matmul_available() else "float32"
        return self

    @model_validator(mode="after")
    def _check_mesh(self) -> TrainerConfig:
        if self.mesh.dp_shard not in (-1, self.world_size):
            raise ValueError(f"trainer.mesh.dp_shard = {self.mesh.dp_shard} must be -1 or trainer.world_size "
                             f"({self.world_size}): only pure data-parallel sharding is built")
        return self
