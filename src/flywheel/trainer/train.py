"""The Trainer: one optimizer step per batch of trajectories, checkpoints, exact resume.

    trainer = Trainer(model, cfg.trainer, run_dir=Path("runs/x"))
    metrics = trainer.step(trajectories)          # loss, grad_norm, mismatch/k3, router_agreement, ...
    engine.update_weights(trainer.version, trainer.state_dict_for_publish())
    path = trainer.save_checkpoint({"buffer": ..., "tasks_seen": 123})
    trainer, extra = Trainer.resume(Path("runs/x"), model_factory)   # the next step is bit-identical

A step (algorithm-blind; the algorithm lives in advantages.py and losses.py):

1. Advantages per trajectory (`trainer.advantage`: GRPO, Dr.GRPO, RLOO over `group_id`, REINFORCE++ over the
   batch's loss tokens); every segment of a trajectory is a row sharing its advantage. Trajectories without a
   reward, broken outside the policy (`env_failure`) or malformed are skipped and counted (`num_skipped`), never
   fatal. The surrogate per token is `trainer.loss` (PPO, dual-clip, GSPO, CISPO, SAPO; losses.py).
2. Rows are packed into micro-batches whose padded size stays within `micro_batch_tokens` (longest
   first, so padding is small; a row longer than the budget gets a micro-batch of its own). With
   `trainer.pack_sequences` a micro-batch is instead one sequence of concatenated rows (packing.py).
3. Old log-probs are recomputed under the current weights (no grad) - for MoE with the sampler's
   routed experts replayed (replay.py). Against the sampler's log-probs they give the off-policy
   weights (TIS / MIS / IcePop) and the mismatch metrics (mismatch.py), computed over the whole batch
   so that sequence-level weights and the aggregation denominators are global.
4. Forward with grad per micro-batch, loss scaled by the global denominators, backward (gradients
   accumulate), then global-norm clipping and one AdamW step. bf16 uses autocast over fp32 master
   weights and fp32 optimizer state.

Checkpoints: with `extra_state_fn` (returns the orchestrator's JSON state) the trainer saves itself
every `checkpoint_every` steps; without it the caller saves when `checkpoint_due()` says so, passing
its state to `save_checkpoint` (orchestrator/loop.py does that).

Batch-invariant mode (`batch_invariant=True`, numerics.batch_invariant): log-probs come from the engine's
native math (modeling/batch_invariant.py), bit-identical to the engine's; see docs/numerics.md. Sharded, FSDP
all-gathers each layer's parameters around that math (distributed.register_batch_invariant), so every rank
computes a row's log-probs bit-identically to one process and to the engine (docs/training.md says where
invariance across ranks holds and where it does not).

After a step, `recomputed_logprobs(i)` gives the trainer's log-prob of each sampled token of the batch's i-th
trajectory (the old log-probs the off-policy correction used), for the rollout browser's mismatch colouring.

Sharded (`group=RankGroup`, trainer/distributed.py; the model already FSDP2-wrapped): every rank is given the
whole batch and computes the same rows, advantages and micro-batches; the micro-batches are dealt to ranks by
tokens, each rank recomputes the old log-probs of its own and a sum over ranks fills in the rest, so correction
weights and denominators are global as above; gradients are summed over ranks by FSDP's reduce-scatter.
Checkpoints are then sharded (trainer/sharded_checkpoint.py, torch.distributed.checkpoint).

LoRA (`trainer.lora.rank > 0`, trainer/lora.py): peft adapters are injected into the model (before FSDP when
sharded: distributed.shard_model), the optimizer holds only them, checkpoints hold only them, and
`state_dict_for_publish()` is the adapter, published with `publish_meta()` as the manifest's marker. In
batch-invariant mode each adapted linear is read merged (modeling/lora.py), as the engine serves it.

Routed experts: `Segment.routed_experts[i]` is taken as the routing of the forward that produced token
i, i.e. of input position i-1 (what an engine records at the decode step that samples token i); it is
replayed at that position. Positions without a record use the trainer's own routing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.tensor import DTensor

from flywheel.config import TrainerConfig
from flywheel.config.base import ConfigError
from flywheel.modeling.batch_invariant import BatchInvariantForward, check_model
from flywheel.policy.model import is_moe
from flywheel.trainer import checkpoint as ckpt
from flywheel.trainer import lora
from flywheel.trainer import sharded_checkpoint as sckpt
from flywheel.trainer.advantages import compute_advantages, weight_negatives
from flywheel.trainer.distributed import RankGroup, assign_micro_batches, local_state_bytes, loss_scale, register_batch_invariant
from flywheel.trainer.losses import aggregation_weights, correction_weights, objective_options, policy_loss
from flywheel.trainer.mismatch import mismatch_metrics
from flywheel.trainer.packing import pack_by_tokens, packed_layout
from flywheel.trainer.precision import apply_matmul_precision
from flywheel.trainer.replay import moe_routers, router_replay
from flywheel.trainer.schedule import warmup_factor
from flywheel.trainer.scored import keeps_logits, scored_positions, target_logprobs
from flywheel.types import Trajectory

log = logging.getLogger(__name__)

REPLAY_SHIFT = 1  # routed_experts[i] is replayed at input position i - REPLAY_SHIFT


@dataclass
class Row:
    """One segment, target-aligned: position j predicts input_ids[j + 1]."""

    seq: int  # index of its trajectory among the trained ones (sequence id for seq-level IS and seq_mean)
    input_ids: list[int]  # [L]
    mask: list[int]  # [L - 1]
    sampler_logprobs: list[float]  # [L - 1]
    routed_experts: list | None  # [L] of [layers][k] or [] (input-aligned after the shift), None if none
    segment: int = 0  # index of the segment in its trajectory


def validate_trajectory(traj: Trajectory) -> str | None:
    """Why a trajectory cannot be trained on, or None when it can."""
    if traj.reward is None:
        return "it has no reward"
    if traj.env_failure:
        return f"it broke outside the policy ({traj.env_failure})"
    for i, s in enumerate(traj.segments):
        n = len(s.token_ids)
        if len(s.loss_mask) != n or len(s.logprobs) != n:
            return (f"segment {i} has {n} tokens but {len(s.loss_mask)} mask entries and {len(s.logprobs)} "
                    f"log-probs; they must be equal")
        if s.routed_experts is not None and s.routed_experts and len(s.routed_experts) != n:
            return f"segment {i} has {n} tokens but {len(s.routed_experts)} routed-expert entries"
    return None


def rows_from_trajectories(batch: list[Trajectory]) -> list[Row]:
    """Flatten trajectories into target-aligned rows (segments without loss tokens are dropped)."""
    rows = []
    for seq, traj in enumerate(batch):
        for k, s in enumerate(traj.segments):
            mask = [1 if m else 0 for m in s.loss_mask[1:]]  # the first token has no prediction
            if len(s.token_ids) < 2 or not any(mask):
                continue
            experts: list | None = None
            if s.routed_experts:
                experts = [[] for _ in s.token_ids]
                for i, e in enumerate(s.routed_experts):
                    if e and s.loss_mask[i] and i - REPLAY_SHIFT >= 0:
                        experts[i - REPLAY_SHIFT] = e
            rows.append(Row(seq, list(s.token_ids), mask, [float(x) for x in s.logprobs[1:]], experts, k))
    return rows


def pack_micro_batches(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Group row indices so each group's padded size (rows x longest) stays within budget_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class Trainer:
    """Policy optimisation over batches of trajectories; see the module docstring."""

    def __init__(self, model: torch.nn.Module, cfg: TrainerConfig, run_dir: Path | None = None, ref_model=None, *,
                 extra_state_fn: Callable[[], dict[str, Any]] | None = None, pad_token_id: int = 0,
                 temperature: float = 1.0, batch_invariant: bool = False, group: RankGroup | None = None):
        if cfg.kl_coef > 0 and ref_model is None:
            raise ValueError("trainer.kl_coef > 0 needs a reference model (ref_model=...); or set kl_coef = 0")
        self.model = model
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        self.extra_state_fn = extra_state_fn
        self.group = group  # None: one process; else a sharded rank (model wrapped by distributed.shard_model)
        self.pad_token_id = pad_token_id
        self.temperature = temperature  # the sampler's: log-probs must be of the same distribution
        # numerics.batch_invariant: score with the engine's native math (bit-identical log-probs)
        self.batch_invariant = bool(batch_invariant)
        self._bi_forwards: dict[int, BatchInvariantForward] = {}
        if self.batch_invariant:
            if cfg.dtype != "float32":
                raise ValueError("numerics.batch_invariant computes in float32 like the engine; set trainer.dtype = "
                                 "'float32' or numerics.batch_invariant = false")
            if cfg.pack_sequences:
                raise ValueError("numerics.batch_invariant scores right-padded rows; set trainer.pack_sequences = "
                                 "false or numerics.batch_invariant = false")
            for m in (model, ref_model):
                if m is not None:
                    check_model(m)
            if cfg.activation_checkpointing:
                log.warning("trainer.activation_checkpointing has no effect with numerics.batch_invariant: the "
                            "batch-invariant forward does not go through the HF layer call it wraps")
        self.lora = cfg.lora if cfg.lora.rank > 0 else None  # trainer.lora: only the adapters train (trainer/lora.py)
        self._base_digest: str | None = None
        if self.lora is not None:
            if self.batch_invariant and self.lora.dropout > 0:
                raise ConfigError("numerics.batch_invariant reads each adapter merged into its weight, where dropout "
                                  "cannot apply; set trainer.lora.dropout = 0 or numerics.batch_invariant = false")
            if not lora.has_lora(model):
                if group is not None:
                    raise ValueError("a sharded model must get its adapters before FSDP wraps it; build it with "
                                     "distributed.shard_model(model, group, cfg.trainer), which applies trainer.lora")
                lora.apply_lora(model, self.lora, cfg.seed)
        apply_matmul_precision(model, cfg.matmul_precision, self.batch_invariant)  # fp8 forward (trainer/precision.py)
        self.device = next(model.parameters()).device
        self.params = [p for p in model.parameters() if p.requires_grad]  # with LoRA: the adapters only
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]),
                                           weight_decay=cfg.weight_decay)
        self.version = 0
        self.state_bytes: dict[str, int] = {}
        # the last step's old log-probs and loss mask [rows, T - 1], each row's (batch index, segment), and the
        # segment lengths of each trained trajectory (by batch index)
        self._recomputed: tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]], dict[int, list[int]]] | None = None
        self._moe_shape: tuple[int, int] | None = None  # (MoE layers, top-k)
        self._keep = not self.batch_invariant and keeps_logits(model)  # the head at scored positions (scored.py)
        if is_moe(cast(Any, model)):  # sampler routing is collated for replay and for the agreement metric
            routers = moe_routers(model)
            self._moe_shape = (len(routers), int(cast(Any, routers[0]).top_k)) if routers else None

    # ------------------------------------------------------------------ forward helpers

    def _autocast(self):
        # sharded: FSDP's MixedPrecisionPolicy casts the parameters instead (distributed.shard_model)
        on = self.cfg.dtype == "bfloat16" and self.group is None
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=on)

    def _collate(self, rows: list[Row]) -> dict[str, Any]:
        if self.cfg.pack_sequences:
            return self._collate_packed(rows)
        t = max(len(r.input_ids) for r in rows)
        ids = torch.full((len(rows), t), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(rows), t), dtype=torch.long)
        experts = None
        shape = self._moe_shape
        if shape is not None and any(r.routed_experts for r in rows):
            experts = torch.full((len(rows), t, *shape), -1, dtype=torch.long)
        for b, r in enumerate(rows):
            n = len(r.input_ids)
            ids[b, :n] = torch.tensor(r.input_ids)
            attn[b, :n] = 1
            if experts is not None and shape is not None and r.routed_experts:
                for pos, e in enumerate(r.routed_experts):
                    if e:
                        if len(e) != shape[0] or any(len(k) != shape[1] for k in e):
                            raise ValueError(f"routed experts per token must be [{shape[0]} layers][top-"
                                             f"{shape[1]}]; got {[len(k) for k in e]}")
                        experts[b, pos] = torch.tensor(e)
        return {"input_ids": ids.to(self.device), "attention_mask": attn.to(self.device), "experts": experts,
                "keep": scored_positions([r.mask for r in rows]) if self._keep else None}

    def _experts_of(self, r: Row) -> torch.Tensor:
        """A row's replayed routing [L, layers, k] (-1 = the trainer's own)."""
        shape = self._moe_shape
        assert shape is not None, "routed experts are collated for MoE models only"
        out = torch.full((len(r.input_ids), *shape), -1, dtype=torch.long)
        for pos, e in enumerate(r.routed_experts or []):
            if e:
                if len(e) != shape[0] or any(len(k) != shape[1] for k in e):
                    raise ValueError(f"routed experts per token must be [{shape[0]} layers][top-"
                                     f"{shape[1]}]; got {[len(k) for k in e]}")
                out[pos] = torch.tensor(e)
        return out

    def _collate_packed(self, rows: list[Row]) -> dict[str, Any]:
        """One sequence of the rows concatenated (packing.py): no attention mask, positions restart per row."""
        ids, pos, unpack = packed_layout([r.input_ids for r in rows])
        experts = None
        if self._moe_shape is not None and any(r.routed_experts for r in rows):
            experts = torch.cat([self._experts_of(r) for r in rows])[None]
        return {"input_ids": ids.to(self.device), "attention_mask": None, "position_ids": pos.to(self.device),
                "unpack": unpack.to(self.device), "experts": experts,
                "keep": scored_positions([r.mask for r in rows], unpack) if self._keep else None}

    def _logprobs(self, model, mb: dict[str, Any], replay: bool, measure: bool = False,
                  entropy: list[torch.Tensor] | None = None):
        """Target log-probs [b, T-1] (fp32) and the router agreement stats of this forward (`num_agree`,
        `num_replayed`, per-layer `layer_agree` / `layer_replayed`). The sampler's routing is replayed when
        `replay` and trainer.router_replay; with `measure` the agreement is counted even without replay. With
        `entropy` (a list) the policy's entropy at each position [b, T-1] is appended to it."""
        apply = self.cfg.router_replay
        experts = mb["experts"] if replay and (apply or measure) else None
        stats: Any
        if self.batch_invariant:
            fwd = self._bi_forwards.get(id(model))
            if fwd is None:
                fwd = self._bi_forwards[id(model)] = BatchInvariantForward(model, module_methods=self.group is not None)
                if self.group is not None:  # FSDP gathers each layer's parameters around its block
                    register_batch_invariant(model)
            logits, stats = fwd(mb["input_ids"], experts, apply_replay=apply)
            lp, ent = target_logprobs(logits, mb["input_ids"], None, self.temperature, entropy is not None)
        else:
            with router_replay(model, experts, apply=apply) as stats, self._autocast():
                keep = mb.get("keep")  # the head at the scored positions only (scored.py)
                out = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], use_cache=False,
                            position_ids=mb.get("position_ids"), **({} if keep is None else {"logits_to_keep": keep}))
                lp, ent = target_logprobs(out.logits, mb["input_ids"], keep, self.temperature, entropy is not None)
        if "unpack" in mb:  # packed: each row's target log-probs, back in the padded [rows, T - 1] layout
            lp = lp[0, mb["unpack"]]
            ent = ent[0, mb["unpack"]] if ent is not None else None
        if entropy is not None:
            assert ent is not None
            entropy.append(ent)
        return lp, stats

    @staticmethod
    def _pad(rows: Sequence[Sequence[float]], t: int) -> torch.Tensor:
        out = torch.zeros((len(rows), t), dtype=torch.float32)
        for b, r in enumerate(rows):
            out[b, :len(r)] = torch.as_tensor(r, dtype=torch.float32)
        return out

    def _filler(self) -> dict[str, Any]:
        """A two-token micro-batch run with zero weight by a rank that has fewer micro-batches than another: every
        FSDP forward and backward is a collective, so all ranks must run as many."""
        return self._collate([Row(0, [self.pad_token_id] * 2, [0], [0.0], None)])

    def _update(self, groups, micro, old, sampler, mask, ref, is_w, row_w, row_adv,
                seq_ids) -> tuple[dict[str, float], float]:
        """One optimizer step: forward/backward per micro-batch (gradients accumulate), clip, step. `groups` and
        `micro` are this rank's; a None group is a filler."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip": 0.0, "ratio": 0.0}
        for g, mb in zip(groups, micro):
            lp, _ = self._logprobs(self.model, mb, replay=True)
            if g is None:
                (lp.sum() * 0.0).backward()  # exact zero gradients; the collectives still run
                continue
            tt = lp.shape[1]
            dev = lambda x, g=g, tt=tt: x[g, :tt].to(self.device)  # noqa: E731
            loss, m = policy_loss(
                lp, dev(old), dev(sampler), row_adv[g].to(self.device), dev(mask), **objective_options(self.cfg),
                ref_logprobs=dev(ref) if ref is not None else None, kl_coef=self.cfg.kl_coef,
                is_weights=dev(is_w), row_weights=row_w[g].to(self.device), seq_ids=seq_ids[g])
            (loss * loss_scale(self.group)).backward()  # FSDP averages over ranks; the loss needs their sum
            n = m["num_tokens"]
            sums["loss"] += m["loss"]
            sums["pg_loss"] += m["pg_loss"]
            sums["kl"] += m["kl"] * n
            sums["clip"] += m["clip_frac"] * n
            sums["ratio"] += m["ratio_mean"] * n
        self.model.eval()
        if self.group is not None:
            keys = list(sums)
            total = self.group.all_reduce_sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64))
            sums = dict(zip(keys, total.tolist()))
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # DTensor grads: a norm over all shards
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        self.optimizer.step()
        # this rank's parameter, gradient and optimizer bytes at their peak (gradients still held); bench trainer
        self.state_bytes = local_state_bytes(self.model, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return sums, grad_norm

    # ------------------------------------------------------------------ the step

    def step(self, batch: list[Trajectory]) -> dict[str, float]:
        """`trainer.update_epochs` optimizer steps over `batch` (one new version); returns float metrics
        (see docs/training.md; loss, clip and grad-norm figures are those of the last epoch)."""
        t0 = time.perf_counter()
        good, good_index, num_skipped = [], [], 0
        self._recomputed = None
        for i, traj in enumerate(batch):
            why = validate_trajectory(traj)
            if why is None:
                good.append(traj)
                good_index.append(i)
            else:
                num_skipped += 1
                log.warning("trainer skips trajectory %s of task %s: %s", traj.group_id, traj.task_id, why)
        rows = rows_from_trajectories(good)
        if not rows:
            return {"step_skipped": 1.0, "num_skipped": float(num_skipped), "version": float(self.version)}
        rewards = [t.graded.value for t in good]
        traj_loss_tokens = [0] * len(good)  # loss tokens per trajectory: the REINFORCE++ statistics weigh them
        for r in rows:
            traj_loss_tokens[r.seq] += sum(r.mask)
        advantages = compute_advantages(rewards, [t.group_id for t in good], self.cfg.advantage, traj_loss_tokens)
        advantages = weight_negatives(advantages, self.cfg.negative_weight)
        lengths = [len(r.input_ids) for r in rows]
        pack = pack_by_tokens if self.cfg.pack_sequences else pack_micro_batches
        all_groups = pack(lengths, self.cfg.micro_batch_tokens)
        costs = [sum(lengths[i] for i in g) if self.cfg.pack_sequences else len(g) * max(lengths[i] for i in g)
                 for g in all_groups]  # tokens each micro-batch's forward processes, padding included
        # this rank's micro-batches (all of them on one process), then fillers up to the busiest rank's count
        groups: list[list[int] | None] = list(all_groups)
        if self.group is not None:
            dealt = assign_micro_batches(costs, self.group.world_size)
            groups = [all_groups[i] for i in dealt[self.group.rank]]
            groups += [None] * (max(map(len, dealt)) - len(groups))
        micro = [self._collate([rows[i] for i in g]) if g is not None else self._filler() for g in groups]

        # 1. old (and reference) log-probs under the current weights, no grad
        t_max = max(len(r.mask) for r in rows)
        old = torch.zeros((len(rows), t_max))
        ref = torch.zeros((len(rows), t_max)) if self.cfg.kl_coef > 0 else None
        layer_agree: list[int] = []
        layer_replayed: list[int] = []
        entropy_sum = 0.0  # policy entropy summed over this rank's loss tokens
        self.model.eval()
        with torch.no_grad():
            for g, mb in zip(groups, micro):
                ents: list[torch.Tensor] = []
                lp, st = self._logprobs(self.model, mb, replay=True, measure=True, entropy=ents)
                if g is None:
                    if ref is not None:
                        self._logprobs(self.ref_model, mb, replay=False)
                    continue
                if st.layer_replayed:
                    layer_agree = [a + b for a, b in zip(st.layer_agree, layer_agree or [0] * len(st.layer_agree))]
                    layer_replayed = [a + b for a, b in
                                      zip(st.layer_replayed, layer_replayed or [0] * len(st.layer_replayed))]
                old[g, :lp.shape[1]] = lp.cpu()
                ent_mask = self._pad([rows[i].mask for i in g], lp.shape[1])
                entropy_sum += float((ents[0].float().cpu() * ent_mask).sum())
                if ref is not None:
                    ref[g, :lp.shape[1]] = self._logprobs(self.ref_model, mb, replay=False)[0].cpu()
        if self.group is not None:  # each rank filled its own rows; the others are 0, so a sum completes them
            self.group.all_reduce_sum(old)
            entropy_sum = float(self.group.all_reduce_sum(torch.tensor([entropy_sum], dtype=torch.float64)))
            if ref is not None:
                self.group.all_reduce_sum(ref)
            if self._moe_shape is not None:
                n = self._moe_shape[0]
                agree = torch.tensor((layer_agree or [0] * n) + (layer_replayed or [0] * n), dtype=torch.long)
                summed = self.group.all_reduce_sum(agree).tolist()
                layer_agree, layer_replayed = summed[:n], summed[n:]
        mask = self._pad([r.mask for r in rows], t_max).bool()
        sampler = self._pad([r.sampler_logprobs for r in rows], t_max)
        seq_ids = torch.tensor([r.seq for r in rows])
        is_w, is_metrics = correction_weights(old, sampler, mask, self.cfg.correction, cap=self.cfg.tis_cap,
                                              alpha=self.cfg.icepop_alpha, beta=self.cfg.icepop_beta, seq_ids=seq_ids)
        row_w = aggregation_weights(mask, self.cfg.aggregation, seq_ids, self.cfg.norm_tokens)
        mism = mismatch_metrics(old, sampler, mask, tis_cap=self.cfg.tis_cap, icepop_alpha=self.cfg.icepop_alpha,
                                icepop_beta=self.cfg.icepop_beta, seq_ids=seq_ids)
        row_adv = advantages[seq_ids]
        self._recomputed = (old, mask, [(good_index[r.seq], r.segment) for r in rows],
                            {good_index[k]: [len(s.token_ids) for s in t.segments] for k, t in enumerate(good)})

        # 2. forward/backward per micro-batch with global weights, then one optimizer step; `update_epochs`
        # times over the same batch (the old log-probs stay those of step 1, so the PPO clip bounds the move)
        for epoch in range(self.cfg.update_epochs):
            factor = warmup_factor(self.version * self.cfg.update_epochs + epoch,
                                   self.cfg.warmup_steps * self.cfg.update_epochs)
            for group in self.optimizer.param_groups:
                group["lr"] = self.cfg.lr * factor
            sums, grad_norm = self._update(groups, micro, old, sampler, mask, ref, is_w, row_w, row_adv, seq_ids)
        self.version += 1

        num_loss_tokens = max(int(mask.sum()), 1)
        elapsed = time.perf_counter() - t0
        num_tokens = sum(len(r.input_ids) for r in rows)
        staleness = [self.version - 1 - t.min_version for t in good if t.min_version >= 0]
        metrics = {
            "version": float(self.version),
            "loss": sums["loss"], "pg_loss": sums["pg_loss"],
            "kl": sums["kl"] / num_loss_tokens,
            "clip_frac": sums["clip"] / num_loss_tokens,
            "entropy": entropy_sum / num_loss_tokens,
            "ratio_mean": sums["ratio"] / num_loss_tokens,
            "grad_norm": grad_norm, "lr": float(self.optimizer.param_groups[0]["lr"]),
            "reward_mean": float(torch.tensor(rewards).float().mean()),
            "advantage_abs_mean": float(advantages.abs().mean()),
            "num_trajectories": float(len(good)), "num_skipped": float(num_skipped),
            "num_rows": float(len(rows)), "num_micro_batches": float(len(all_groups)),
            "num_tokens": float(num_tokens), "num_loss_tokens": float(int(mask.sum())),
            "num_padded_tokens": float(sum(costs)),
            "update_epochs": float(self.cfg.update_epochs),
            "staleness_mean": float(sum(staleness) / len(staleness)) if staleness else 0.0,
            "staleness_max": float(max(staleness)) if staleness else 0.0,
            "step_time_s": elapsed, "tokens_per_s": num_tokens / max(elapsed, 1e-9),
            **{k: float(v) for k, v in is_metrics.items()},
            **{f"mismatch/{k}": v for k, v in mism.items()},
        }
        if sum(layer_replayed):  # MoE: sampler vs trainer top-k agreement, overall and per MoE layer
            metrics["router_agreement"] = sum(layer_agree) / sum(layer_replayed)
            for i, (a, n) in enumerate(zip(layer_agree, layer_replayed)):
                metrics[f"router_agreement/layer_{i}"] = a / n if n else 1.0
        if not all(map(lambda v: v == v, (metrics["loss"], grad_norm))):
            log.warning("trainer step %d produced a NaN loss or gradient norm", self.version)
        if self.extra_state_fn is not None and self.checkpoint_due():
            self.save_checkpoint(self.extra_state_fn())
        return metrics

    def recomputed_logprobs(self, index: int) -> list[list[float | None]] | None:
        """The last step's recomputed (old) log-prob of every token of its batch's `index`-th trajectory, per
        segment, as the off-policy correction used them; None at tokens without one (prompt, observations, the
        first token). None when that trajectory was not trained on (skipped) or no step has run."""
        if self._recomputed is None:
            return None
        old, mask, where, lengths = self._recomputed
        if index not in lengths:
            return None
        out: list[list[float | None]] = [[None] * n for n in lengths[index]]
        for r, (i, k) in enumerate(where):
            if i != index:
                continue
            seg = out[k]
            values, on = old[r, :len(seg) - 1].tolist(), mask[r, :len(seg) - 1].tolist()
            for j, (v, m) in enumerate(zip(values, on)):
                if m:
                    seg[j + 1] = v
        return out

    # ------------------------------------------------------------------ weights and checkpoints

    def state_dict_for_publish(self) -> dict[str, torch.Tensor]:
        """A detached copy of every state-dict tensor (the model's names), safe to hand to another thread. With
        trainer.lora: the adapter only (`<module>.lora_A` / `.lora_B`, trainer/lora.py); publish it with
        `publish_meta()` as the manifest's adapter marker."""
        if self.lora is not None:
            return lora.adapter_tensors(self.model)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def publish_meta(self) -> dict[str, Any] | None:
        """With trainer.lora, the adapter marker for `Publisher.publish(..., adapter=...)` (rank, scale, the digest
        of the base weights it belongs to); None for full weights."""
        if self.lora is None:
            return None
        if self._base_digest is None:  # the base is frozen: one pass over its bytes for the whole run
            self._base_digest = lora.base_digest(self.model)
        return lora.adapter_meta(self.model, self.lora, self._base_digest)

    def _checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The model tensors a checkpoint holds: all of them, or with LoRA only the adapter (the base is the
        run's base model directory, unchanged)."""
        if self.lora is not None:
            return {k: p.detach().clone() for k, p in lora.adapter_parameters(self.model).items()}
        return self.state_dict_for_publish()

    def checkpoint_due(self) -> bool:
        """True after a step that ends a `checkpoint_every` period (and the trainer has a run_dir)."""
        every = self.cfg.checkpoint_every
        return self.run_dir is not None and every > 0 and self.version > 0 and self.version % every == 0

    @property
    def checkpoint_dir(self) -> Path:
        if self.run_dir is None:
            raise ValueError("this Trainer has no run_dir; pass run_dir=... to save or load checkpoints")
        return self.run_dir / "checkpoints"

    def save_checkpoint(self, extra_state: dict[str, Any] | None = None) -> Path:
        """Write model, optimizer, RNG and `extra_state` (JSON) atomically; returns the checkpoint dir.
        Sharded: a collective, every rank calls it (`extra_state` is rank 0's) and writes its own shards."""
        trainer_state = {"cfg": self.cfg.model_dump(mode="json")}
        if self.group is not None:
            path = sckpt.write_sharded(self.checkpoint_dir, self.version, self.model, self.optimizer, self.group,
                                       trainer_state, extra_state)
            if self.group.is_main:
                ckpt.prune_checkpoints(self.checkpoint_dir, self.cfg.keep_checkpoints)
            self.group.barrier()
            return path
        path = ckpt.write_checkpoint(self.checkpoint_dir, self.version, self._checkpoint_tensors(),
                                     self.optimizer.state_dict(),
                                     trainer_state=trainer_state, extra_state=extra_state)
        ckpt.prune_checkpoints(self.checkpoint_dir, self.cfg.keep_checkpoints)
        return path

    def load_checkpoint(self, path: Path | None = None) -> dict[str, Any]:
        """Restore from `path` (default: the newest in run_dir); returns the orchestrator (extra) state."""
        path = Path(path) if path is not None else ckpt.latest_checkpoint(self.checkpoint_dir)
        if path is None:
            raise ValueError(f"no checkpoint under '{self.checkpoint_dir}'; train first or start a fresh run")
        if sckpt.is_sharded(path):  # saved by a sharded trainer, at this or any other world size
            state = sckpt.read_sharded(path, self.model, self.optimizer, self.group)
            self.version = int(state["version"])
            return state["extra"]
        state = ckpt.read_checkpoint(path)
        if self.group is not None:  # a run that grows from one process to a group: each rank keeps its shards
            sckpt.load_single_process(state, self.model, self.optimizer)
            self.version = int(state["version"])
            return state["extra"]
        fit = "; build the model with the run's config"
        has_adapter = any(".lora_A." in k for k in state["model"])
        if has_adapter != (self.lora is not None):
            what = "a LoRA adapter" if has_adapter else "full weights"
            raise ValueError(f"checkpoint '{path}' holds {what} but this trainer has trainer.lora.rank = "
                             f"{self.cfg.lora.rank}; resume with the run's trainer.lora")
        try:
            missing, unexpected = self.model.load_state_dict(state["model"], strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"checkpoint '{path}' does not fit this model: {str(err)[:300]}{fit}") from None
        if self.lora is not None:  # an adapter checkpoint: every adapter tensor present, the base left as built
            adapter = set(lora.adapter_parameters(self.model))
            missing = [k for k in missing if k in adapter]
        if missing or unexpected:
            raise ValueError(f"checkpoint '{path}' does not fit this model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}{fit}")
        self.optimizer.load_state_dict(state["optimizer"])
        ckpt.restore_rng(*state["rng"])
        self.version = int(state["version"])
        return state["extra"]

    @classmethod
    def resume(cls, run_dir: Path, model_factory: Callable[[], torch.nn.Module], cfg: TrainerConfig | None = None,
               ref_model=None, **kwargs) -> tuple[Trainer, dict[str, Any]]:
        """A Trainer restored from the newest checkpoint in `run_dir`, and the orchestrator state saved with it.

        `cfg` defaults to the config stored in the checkpoint."""
        run_dir = Path(run_dir)
        path = ckpt.latest_checkpoint(run_dir / "checkpoints")
        if path is None:
            raise ValueError(f"no checkpoint under '{run_dir / 'checkpoints'}' to resume from")
        if cfg is None:
            cfg = TrainerConfig.model_validate(json.loads((path / "state.json").read_text())["trainer"]["cfg"])
        trainer = cls(model_factory(), cfg, run_dir=run_dir, ref_model=ref_model, **kwargs)
        extra = trainer.load_checkpoint(path)
        return trainer, extra
