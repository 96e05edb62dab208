"""The trainer's forward in batch-invariant mode: the engine's native Qwen3 math, differentiable, over
whole padded sequences.

    fwd = BatchInvariantForward(model)                        # any Qwen3 / Qwen3-MoE HF model
    logits, stats = fwd(input_ids, routed_experts=None)       # [B, T] -> [B, T, V] float32
    stats.layer_agree, stats.layer_replayed                   # per-layer router agreement (MoE replay)

Why a second forward: the HF forward (SDPA over the whole sequence, other op order) gives each token a
log-prob ~1e-6 away from the engine's. Here every op is the one `numerics/qwen3.py` runs — the same
`linear` (rows padded to a multiple of 16: one BLAS kernel family, one reduction order per row), the same
RMSNorm and rotary tables, the same MoE expert loop (ascending expert order per token) — and attention
is `numerics/attention.py`, which the engine also uses when `numerics.batch_invariant = true`. So a
token's log-prob is bit-identical to the engine's, whatever the batch, the padding or the micro-batch.
Backward needs no invariance; autograd goes through the same ops.

Router replay: `routed_experts` [B, T, L, K] (-1 = route freely) replaces the top-k indices per token
and layer; the gate weights are the router's softmax gathered at the replayed experts and renormalised
(`norm_topk_prob`), as `trainer/replay.py` does for the HF forward, so the router still gets gradients.
With the engine's own routing replayed, the result is bit-identical to not replaying.

Right padding is assumed (positions 0..T-1 in every row), as the trainer collates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from flywheel.numerics.attention import sequence_attention
from flywheel.numerics.qwen3 import Qwen3Runner, linear, mix_experts, rms_norm, supports


@dataclass
class RoutingStats:
    """Per MoE layer: (token, layer) pairs replayed, and those where the trainer's own top-k set agreed."""

    layer_agree: list[int] = field(default_factory=list)
    layer_replayed: list[int] = field(default_factory=list)

    @property
    def num_agree(self) -> int:
        return sum(self.layer_agree)

    @property
    def num_replayed(self) -> int:
        return sum(self.layer_replayed)


def check_model(model) -> None:
    """ValueError unless `model` can run in batch-invariant mode (a float32 Qwen3 / Qwen3-MoE)."""
    if not supports(model):
        raise ValueError(f"numerics.batch_invariant needs a Qwen3 / Qwen3-MoE model; model_type "
                         f"'{getattr(model.config, 'model_type', None)}' is not supported: set it to false")
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"numerics.batch_invariant computes in float32 like the engine; the model is {dtype}: "
                         f"load it with model.dtype = 'float32' or set numerics.batch_invariant = false")


def moe_block(runner: Qwen3Runner, mlp, h: torch.Tensor, replay: torch.Tensor | None, stats: RoutingStats | None,
              apply: bool = True):
    """Qwen3Runner._mlp for MoE layers, op for op, with optional replayed experts. h [M, D], replay [M, K]
    (-1 = route freely). `apply=False` only counts the agreement with `replay`."""
    gate, experts = mlp.gate, mlp.experts
    router_logits = linear(h, gate.weight)  # [M, E]
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    top_w, top_i = torch.topk(probs, gate.top_k, dim=-1)  # [M, k]
    if replay is not None:
        use = (replay >= 0).all(-1)  # [M]
        if stats is not None:
            with torch.no_grad():
                agree = (top_i.sort(-1).values == replay.sort(-1).values).all(-1) & use
                stats.layer_agree.append(int(agree.sum()))
                stats.layer_replayed.append(int(use.sum()))
        if apply and bool(use.any()):
            top_i = torch.where(use[:, None], replay, top_i)
            top_w = probs.gather(-1, top_i)
    if gate.norm_topk_prob:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    return mix_experts(h, experts, top_i, top_w.to(router_logits.dtype))


class BatchInvariantForward:
    """Logits of whole sequences with the engine's batch-invariant math (see the module docstring)."""

    def __init__(self, model, max_seq_len: int | None = None):
        check_model(model)
        self.model = model
        self.max_seq_len = int(max_seq_len or model.config.max_position_embeddings)
        self.runner = Qwen3Runner(model, self.max_seq_len, batch_invariant=True)
        self.num_moe_layers = sum(hasattr(layer.mlp, "experts") for layer in self.runner.layers)

    def __call__(self, input_ids: torch.Tensor, routed_experts: torch.Tensor | None = None, *,
                 apply_replay: bool = True) -> tuple[torch.Tensor, RoutingStats]:
        """input_ids [B, T] -> (logits [B, T, V] float32, routing stats). routed_experts [B, T, L, K] (L = MoE
        layers, -1 = route freely) or None; `apply_replay=False` only measures the agreement with them."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens]; got shape {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        if t > self.max_seq_len:
            raise ValueError(f"sequences of {t} tokens exceed the context of {self.max_seq_len}; shorten them")
        run, model = self.runner, self.model
        if routed_experts is not None:
            if not run.is_moe:
                raise ValueError("routed experts were given for a dense model; pass routed_experts=None")
            if tuple(routed_experts.shape) != (b, t, self.num_moe_layers, run.top_k):
                raise ValueError(f"routed_experts must be [{b}, {t}, {self.num_moe_layers}, {run.top_k}]; "
                                 f"got {tuple(routed_experts.shape)}")
            routed_experts = routed_experts.to(device=run.device, dtype=torch.long)
        n = b * t
        ids = input_ids.to(run.device).reshape(n)
        x = F.embedding(ids, model.model.embed_tokens.weight)  # [N, D]
        cos = run.cos[:t].repeat(b, 1)  # [N, hd], positions 0..T-1 per row
        sin = run.sin[:t].repeat(b, 1)
        stats = RoutingStats()
        moe_layer = 0
        for layer in run.layers:
            attn = layer.self_attn
            h = rms_norm(x, layer.input_layernorm.weight, run.eps)
            q, k, v = run._qkv(attn, h, cos, sin)  # [N, H, hd], [N, KV, hd]
            o = sequence_attention(q.view(b, t, run.num_heads, run.head_dim),
                                   k.view(b, t, run.num_kv_heads, run.head_dim),
                                   v.view(b, t, run.num_kv_heads, run.head_dim), run.scaling).reshape(n, -1)
            x = x + linear(o, attn.o_proj.weight, attn.o_proj.bias)
            h = rms_norm(x, layer.post_attention_layernorm.weight, run.eps)
            if hasattr(layer.mlp, "experts"):
                replay = None if routed_experts is None else routed_experts[:, :, moe_layer].reshape(n, -1)
                x = x + moe_block(run, layer.mlp, h, replay, stats, apply_replay)
                moe_layer += 1
            else:
                x = x + run._mlp(layer.mlp, h)[0]
        return run._logits(x).view(b, t, -1), stats
