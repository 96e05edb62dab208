"""The trainer's forward in batch-invariant mode: the engine's native Qwen3 math, differentiable, over
whole padded sequences.

    fwd = BatchInvariantForward(model)                        # any Qwen3 / Qwen3-MoE HF model
    logits, stats = fwd(input_ids, routed_experts=None)       # [B, T] -> [B, T, V] float32
    stats.layer_agree, stats.layer_replayed                   # per-layer router agreement (MoE replay)

Why a second forward: the HF forward (SDPA over the whole sequence, other op order) gives each token a
log-prob ~1e-6 away from the engine's. Here every op is the one `modeling/decoder.py` runs — the same
`linear` (rows padded to a multiple of 16: one BLAS kernel family, one reduction order per row), the same
RMSNorm and rotary tables, the same MoE expert loop (ascending expert order per token) — and attention
is `modeling/attention.py`, which the engine also uses when `numerics.batch_invariant = true`. So a
token's log-prob is bit-identical to the engine's, whatever the batch, the padding or the micro-batch.
Backward needs no invariance; autograd goes through the same ops.

Router replay: `routed_experts` [B, T, L, K] (-1 = route freely) replaces the top-k indices per token
and layer; the gate weights are the router's softmax gathered at the replayed experts and renormalised
(`norm_topk_prob`), as `trainer/replay.py` does for the HF forward, so the router still gets gradients.
With the engine's own routing replayed, the result is bit-identical to not replaying.

Right padding is assumed (positions 0..T-1 in every row), as the trainer collates.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from flywheel.modeling.attention import sequence_attention
from flywheel.modeling.decoder import DecoderRunner, linear, mix_experts
from flywheel.modeling.families import native_family

MODEL_METHOD = "flywheel_bi_forward"  # the model's attribute running the whole batch-invariant forward
LAYER_METHOD = "flywheel_bi_block"  # each decoder layer's attribute running its block


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
    """ValueError unless `model` can run in batch-invariant mode (a float32 model of a registry family)."""
    family, why_not = native_family(model, model.config.max_position_embeddings)
    if family is None:
        raise ValueError(f"numerics.batch_invariant needs a model the native runner covers ({why_not}): "
                         "set numerics.batch_invariant = false")
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"numerics.batch_invariant computes in float32 like the engine; the model is {dtype}: "
                         f"load it with model.dtype = 'float32' or set numerics.batch_invariant = false")


def moe_block(runner: DecoderRunner, mlp, h: torch.Tensor, replay: torch.Tensor | None, stats: RoutingStats | None,
              apply: bool = True):
    """DecoderRunner.mlp_block for MoE layers, op for op, with optional replayed experts. h [M, D], replay [M, K]
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
    """Logits of whole sequences with the engine's batch-invariant math (see the module docstring).

    With `module_methods=True` the whole forward and each decoder layer's block are set as attributes of the
    modules (`MODEL_METHOD` on the model, `LAYER_METHOD` on each layer) and called through them, so that a sharded
    trainer can have FSDP all-gather a layer's parameters around its block and reduce-scatter its gradients
    after its backward (`trainer/distributed.py`, `register_fsdp_forward_method`): the math reads whole weight
    tensors, which under FSDP exist only inside those calls. (Off by default: the attributes hold this object,
    so the model could no longer be deep-copied.)"""

    def __init__(self, model, max_seq_len: int | None = None, *, module_methods: bool = False):
        check_model(model)
        self.model = model
        self.max_seq_len = int(max_seq_len or model.config.max_position_embeddings)
        self.runner = DecoderRunner(model, self.max_seq_len, batch_invariant=True)
        self.num_moe_layers = sum(hasattr(layer.mlp, "experts") for layer in self.runner.layers)
        self.module_methods = bool(module_methods)
        if self.module_methods:
            for layer in self.runner.layers:
                setattr(layer, LAYER_METHOD, functools.partial(self._block, layer))
            setattr(model, MODEL_METHOD, self._forward)

    def __call__(self, input_ids: torch.Tensor, routed_experts: torch.Tensor | None = None, *,
                 apply_replay: bool = True) -> tuple[torch.Tensor, RoutingStats]:
        """input_ids [B, T] -> (logits [B, T, V] float32, routing stats). routed_experts [B, T, L, K] (L = MoE
        layers, -1 = route freely) or None; `apply_replay=False` only measures the agreement with them."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens]; got shape {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        if t > self.max_seq_len:
            raise ValueError(f"sequences of {t} tokens exceed the context of {self.max_seq_len}; shorten them")
        run = self.runner
        if routed_experts is not None:
            if not run.is_moe:
                raise ValueError("routed experts were given for a dense model; pass routed_experts=None")
            if tuple(routed_experts.shape) != (b, t, self.num_moe_layers, run.top_k):
                raise ValueError(f"routed_experts must be [{b}, {t}, {self.num_moe_layers}, {run.top_k}]; "
                                 f"got {tuple(routed_experts.shape)}")
            routed_experts = routed_experts.to(device=run.device, dtype=torch.long)
        forward = getattr(self.model, MODEL_METHOD) if self.module_methods else self._forward
        logits, agree, replayed = forward(input_ids.to(run.device), routed_experts, apply_replay)
        return logits, RoutingStats(agree, replayed)

    def _forward(self, input_ids: torch.Tensor, routed_experts: torch.Tensor | None, apply_replay: bool):
        """The whole forward: (logits [B, T, V], per-MoE-layer agreed and replayed counts)."""
        run, model = self.runner, self.model
        b, t = input_ids.shape
        n = b * t
        x = F.embedding(input_ids.reshape(n), model.model.embed_tokens.weight)  # [N, D]
        cos = run.cos[:t].repeat(b, 1)  # [N, hd], positions 0..T-1 per row
        sin = run.sin[:t].repeat(b, 1)
        agree: list[int] = []
        replayed: list[int] = []
        moe_layer = 0
        for layer in run.layers:
            replay = None
            if routed_experts is not None and hasattr(layer.mlp, "experts"):
                replay = routed_experts[:, :, moe_layer].reshape(n, -1)
            block = getattr(layer, LAYER_METHOD) if self.module_methods else functools.partial(self._block, layer)
            x, counts = block(x, cos, sin, b, t, replay, apply_replay)
            if counts is not None:
                agree.append(counts[0])
                replayed.append(counts[1])
            moe_layer += hasattr(layer.mlp, "experts")
        return run.logits(x).view(b, t, -1), agree, replayed

    def _block(self, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, b: int, t: int,
               replay: torch.Tensor | None, apply_replay: bool):
        """One decoder layer on x [N = B*T, D]: (x, (agreed, replayed) when experts were replayed, else None)."""
        run = self.runner
        n = b * t

        def attend(q, k, v):  # [N, H, hd], [N, KV, hd] over whole sequences -> [N, H*hd]
            return sequence_attention(q.view(b, t, run.num_heads, run.head_dim),
                                      k.view(b, t, run.num_kv_heads, run.head_dim),
                                      v.view(b, t, run.num_kv_heads, run.head_dim), run.scaling).reshape(n, -1)

        if not hasattr(layer.mlp, "experts"):
            return run.block(layer, x, cos, sin, attend)[0], None
        stats = RoutingStats()
        x, _ = run.block(layer, x, cos, sin, attend,
                         lambda mlp, h: (moe_block(run, mlp, h, replay, stats if replay is not None else None,
                                                   apply_replay), None))
        return x, ((stats.layer_agree[0], stats.layer_replayed[0]) if replay is not None else None)
