"""The native decoder forward for every family in the registry (modeling/families.py), over a pooled KV cache.

    runner = DecoderRunner(model, max_seq_len=2048)            # Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE
    cache = runner.new_cache(capacity=600)
    logits_v, routed = runner.prefill(prompt_ids, cache)            # logits of the last prompt position
    logits_bv, routed = runner.decode(last_tokens, [cache_a, ...])  # one token for every running sequence

Why not the HF forward: on a CPU the engine's speed comes from never computing finished sequences or
prompt padding and from few Python calls per step. Each sequence's cache is a slot of one pool
(`modeling/kv_pool.py`: k, v [num_layers, num_slots, KV, capacity, hd]); linears run batched over the live
rows only, and a decode step attends over all its rows in place, one SDPA call per layer with a mask of each
row's length (GQA without copies, no per-row loop, no cache copied).

Why it reads the HF module's own parameters on every call: `update_weights` swaps parameter `.data`
pointers, and the runner sees the new weights at the next call with nothing to rebuild. A projection with a peft
LoRA adapter (the trainer's batch-invariant forward of a LoRA run) is read merged (`modeling/lora.py`), as the
engine serves it.

Default mode is not batch-invariant: a row's result may differ in the last bits between decoding alone and
in a batch (MKL picks other kernels for small row counts, and the batched SDPA reduces over the longest
row's keys); log-probs agree within float32 rounding. `pad_rows=True` pads every linear's rows to a
multiple of `ROW_TILE` = 16 (M = 1, 2, 3, 5, 7, 9 differ from M >= 8 on an AMD EPYC; on an Intel Xeon with
AVX-512, M = 8 differs from every larger multiple of 8). With 2+ threads that holds only in MKL's strict
reproducible mode, which `import flywheel` sets (modeling/blas.py): otherwise MKL splits some reductions
between threads at some row counts.

`batch_invariant=True` (numerics.batch_invariant) makes a token's log-prob bit-identical whether it came from
a prefill, a decode step in any batch, or the trainer's forward (`flywheel.modeling.batch_invariant`): rows
padded to ROW_TILE, and attention computed the same way in prefill, decode and the trainer
(`flywheel.modeling.attention`: fixed 64-key tiles, 8-row query blocks), over the pool in place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from flywheel.modeling import attention as bi_attention
from flywheel.modeling import blas
from flywheel.modeling.families import native_family
from flywheel.modeling.kv_pool import KVPool, PooledKVCache
from flywheel.modeling.lm_head import has_fp32_lm_head
from flywheel.modeling.lora import linear_weight, lora_factors

ROW_TILE = 16  # CPU: linears run on a multiple of this many rows: one kernel family, one reduction order
GPU_ROW_TILE = 128  # CUDA: every matmul is exactly [GPU_ROW_TILE, K] @ [K, N]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           pad_rows: bool = True) -> torch.Tensor:
    """F.linear whose result for each row does not depend on the other rows (batch-invariant);
    `pad_rows=False` is plain F.linear (the engine's default mode: fastest, rows may differ in the last bits).

    CPU: rows padded to a multiple of ROW_TILE (MKL keeps one kernel family and reduction order per row).
    CUDA: cuBLAS picks its kernel (tiles, split-K) by problem size — padding is not enough, and neither is one
    batched matmul of fixed tiles (measured on an H200: benchmarks/results/numerics_cuda_h200.json) — so the
    rows go through fixed-shape [GPU_ROW_TILE, K] matmuls, one launch each: exact, but slow (a fixed-tile
    kernel is the way to make it fast; docs/numerics.md)."""
    if not pad_rows:
        return F.linear(x, weight, bias)
    num_rows = x.shape[0]
    tile = GPU_ROW_TILE if x.is_cuda else ROW_TILE
    pad = (-num_rows) % tile
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    if x.is_cuda and x.shape[0] > tile:
        return torch.cat([F.linear(chunk, weight, bias) for chunk in x.split(tile)])[:num_rows]
    return F.linear(x, weight, bias)[:num_rows] if pad else F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The families' RMSNorm (LlamaRMSNorm, Qwen3RMSNorm), same op order as transformers (statistics in float32)."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class KVCache:
    """One sequence's keys and values: k, v [num_layers, num_kv_heads, capacity, head_dim]; `length` filled."""

    k: torch.Tensor
    v: torch.Tensor
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


def mix_experts(h: torch.Tensor, experts, top_i: torch.Tensor, top_w: torch.Tensor,
                pad_rows: bool = True) -> torch.Tensor:
    """Weighted sum of each token's routed experts. h [M, D], top_i / top_w [M, k] -> [M, D].

    Ascending expert order, as transformers does, so each token's sum has the same order in any batch.
    Out-of-place `index_add`, so the trainer's batch-invariant forward can differentiate through it."""
    out = torch.zeros_like(h)
    for e in torch.unique(top_i).tolist():
        token_idx, k_pos = torch.where(top_i == e)
        g, u = linear(h[token_idx], experts.gate_up_proj[e], pad_rows=pad_rows).chunk(2, dim=-1)
        y = linear(experts.act_fn(g) * u, experts.down_proj[e], pad_rows=pad_rows) * top_w[token_idx, k_pos, None]
        out = out.index_add(0, token_idx, y.to(out.dtype))
    return out


class DecoderRunner:
    """Prefill and batched decode for the registry's families, reading the HF module's parameters live."""

    reuses_prefixes = True  # prefill(start=n) continues a cache whose first n positions are filled
    adds_lora_factors = True  # every projection goes through _proj (modeling/lora.py lora_factors)

    def __init__(self, model, max_seq_len: int, batch_invariant: bool = False, pad_rows: bool = False,
                 kv_dtype: str = "bf16"):
        family, why_not = native_family(model, max_seq_len)
        if family is None:
            raise ValueError(f"the native runner does not cover this model: {why_not}")
        cfg = model.config
        self.family = family
        self.qk_norm = family.qk_norm
        self.model = model
        self.batch_invariant = bool(batch_invariant)
        if self.batch_invariant and not next(model.parameters()).is_cuda:
            blas.require_strict()  # one reduction order per output, whatever MKL's threads (modeling/blas.py)
        self.pad_rows = self.batch_invariant or bool(pad_rows)  # batch invariance needs the padded row tiles
        self.layers = list(model.model.layers)
        self.num_layers = len(self.layers)
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.scaling = attn.scaling
        self.eps = self.layers[0].input_layernorm.variance_epsilon
        self.is_moe = any(hasattr(layer.mlp, "experts") for layer in self.layers)
        self.top_k = getattr(cfg, "num_experts_per_tok", 0)
        rotary = model.model.rotary_emb
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # cos/sin [max_seq_len, head_dim], same arithmetic as the HF rotary embedding
        positions = torch.arange(max_seq_len, device=self.device).float()
        freqs = positions[:, None] * rotary.inv_freq.to(device=self.device, dtype=torch.float)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * rotary.attention_scaling).to(self.dtype)
        self.sin = (emb.sin() * rotary.attention_scaling).to(self.dtype)
        # caches are slots of one pool, so a decode step attends over all its rows in place: one SDPA call
        # per layer (batch-invariant mode: whole key tiles, modeling/attention.py)
        self.kv_pool = KVPool(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype, self.device,
                              max_capacity=max_seq_len, kv_dtype=kv_dtype)

    def new_cache(self, capacity: int) -> PooledKVCache:
        """A zeroed pool slot of at least `capacity` positions, given back when the cache is dropped."""
        return self.kv_pool.allocate(capacity)

    @staticmethod
    def detach(cache: KVCache | PooledKVCache) -> KVCache:
        """A standalone copy of the `cache.length` positions `cache` holds, its pool slot given back: what a
        prefix store keeps (it should not hold pool slots, which widen every decode step's slot range)."""
        n = cache.length
        out = KVCache(cache.k[:, :, :n].clone(), cache.v[:, :, :n].clone(), n)
        release = getattr(cache, "release", None)
        if release is not None:
            release()
        return out

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, weight, bias, self.pad_rows)

    def _proj(self, module, x: torch.Tensor) -> torch.Tensor:
        """A projection (nn.Linear, or a peft LoRA layer): x W^T + b, plus scale (x A^T) B^T for an adapter served
        unmerged (modeling/lora.py), through the same row-invariant linear."""
        y = self._linear(x, linear_weight(module), module.bias)
        factors = lora_factors(module)
        if factors is not None:
            a, b, scale = factors
            y = y + self._linear(self._linear(x, a), b) * scale
        return y

    # ---- blocks ------------------------------------------------------------------------------------

    def qkv(self, attn, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """h [M, D] -> q [M, H, hd], k and v [M, KV, hd] with the q/k norms (Qwen3) and rotary applied."""
        m = h.shape[0]
        q = self._proj(attn.q_proj, h).view(m, self.num_heads, self.head_dim)
        k = self._proj(attn.k_proj, h).view(m, self.num_kv_heads, self.head_dim)
        v = self._proj(attn.v_proj, h).view(m, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q = rms_norm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
            k = rms_norm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
        cos, sin = cos[:, None, :], sin[:, None, :]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def mlp_block(self, mlp, h: torch.Tensor):
        """h [M, D] -> (out [M, D], routed expert ids [M, k] or None)."""
        if not hasattr(mlp, "experts"):
            gate = self._proj(mlp.gate_proj, h)
            up = self._proj(mlp.up_proj, h)
            return self._proj(mlp.down_proj, mlp.act_fn(gate) * up), None
        gate, experts = mlp.gate, mlp.experts
        router_logits = self._linear(h, gate.weight)  # [M, E]
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
        top_w, top_i = torch.topk(probs, gate.top_k, dim=-1)  # [M, k]
        if gate.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return mix_experts(h, experts, top_i, top_w.to(router_logits.dtype), self.pad_rows), top_i

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        h = rms_norm(h, self.model.model.norm.weight, self.model.model.norm.variance_epsilon)
        head = self.model.lm_head
        bias = getattr(head, "bias", None)
        if has_fp32_lm_head(head):  # numerics.fp32_lm_head (modeling/lm_head.py)
            return self._linear(h.float(), head.weight.float(), None if bias is None else bias.float())
        return self._linear(h, head.weight, bias).float()

    def block(self, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
              mlp: Callable[[Any, torch.Tensor], tuple[torch.Tensor, Any]] | None = None):
        """One decoder layer on rows x [M, D]: (x, the MLP's second result: routed expert ids or None).

        The one layer of every path: prefill, decode and the trainer's exact forward differ only in `attend`
        (q [M, H, hd], k and v [M, KV, hd] -> [M, H*hd]: into a cache, over the pool, or over whole sequences)
        and, for the trainer's router replay, in `mlp` (default `mlp_block`)."""
        attn = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, self.eps)
        q, k, v = self.qkv(attn, h, cos, sin)
        x = x + self._proj(attn.o_proj, attend(q, k, v))
        h, extra = (mlp or self.mlp_block)(layer.mlp, rms_norm(x, layer.post_attention_layernorm.weight, self.eps))
        return x + h, extra

    # ---- public ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, ids: list[int], cache: PooledKVCache, start: int = 0):
        """Run the prompt `ids` into `cache`, whose first `start` positions already hold the keys and values
        of ids[:start] (a reused prefix, see inference/prefix_cache.py; 0 = an empty cache). Returns (logits
        [V] float32 of the last position, routed expert ids [num_layers, k] of the last position or None)."""
        n = len(ids)
        assert cache.length == start and 0 <= start < n <= cache.capacity
        if start and self.batch_invariant:
            raise ValueError("a prefill over a reused prefix is not batch-invariant; start from an empty cache")
        x = F.embedding(torch.tensor(ids[start:], device=self.device), self.model.model.embed_tokens.weight)  # [T, D]
        cos, sin = self.cos[start:n], self.sin[start:n]
        # queries start..n-1 see keys 0..their own position (is_causal aligns the mask top-left: only for start 0)
        mask = (torch.arange(n, device=self.device)[None, :] <= torch.arange(start, n, device=self.device)[:, None]
                if start else None)
        routed = []
        for li, layer in enumerate(self.layers):
            def attend(q, k, v, li=li):  # into the cache, then over it (batch-invariant: whole key tiles)
                cache.k[li, :, start:n] = self.kv_pool.quantize(k.transpose(0, 1))
                cache.v[li, :, start:n] = self.kv_pool.quantize(v.transpose(0, 1))
                if self.batch_invariant:
                    return bi_attention.prefill_attention(q, cache.k[li], cache.v[li], self.scaling)  # [T, H*hd]
                o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], cache.k[li, :, :n][None],
                                                   cache.v[li, :, :n][None], attn_mask=mask, is_causal=mask is None,
                                                   scale=self.scaling, enable_gqa=True)  # [1, H, T, hd]
                return o[0].transpose(0, 1).reshape(n - start, -1)
            x, top_i = self.block(layer, x, cos, sin, attend)
            if top_i is not None:
                routed.append(top_i[-1])
        cache.length = n
        logits = self.logits(x[-1:])[0]
        return logits, (torch.stack(routed) if routed else None)

    @torch.inference_mode()
    def decode(self, tokens: list[int], caches: list[PooledKVCache]):
        """One step: feed tokens[i] at position caches[i].length (caches from `new_cache`). Returns (logits
        [B, V] float32, routed expert ids [B, num_layers, k] or None)."""
        self.kv_pool.compact(caches)  # no freed slot inside the step's range (each would cost a row of work)
        step = self.kv_pool.decode_step(caches, exact_tiles=self.batch_invariant)
        pos_t = step.positions_t
        x = F.embedding(torch.tensor(tokens, device=self.device), self.model.model.embed_tokens.weight)  # [B, D]
        cos, sin = self.cos[pos_t], self.sin[pos_t]
        routed = []
        attend = step.attend if self.batch_invariant else step.attend_sdpa
        for li, layer in enumerate(self.layers):
            # over the pool in place, all rows at once: [B, H*hd]
            x, top_i = self.block(layer, x, cos, sin, functools.partial(attend, li, scale=self.scaling))
            if top_i is not None:
                routed.append(top_i)
        for c in caches:
            c.length += 1
        return self.logits(x), (torch.stack(routed, dim=1) if routed else None)
