"""The batch-invariant engine's KV caches: slots of one pooled tensor, so a decode step attends in place.

    pool = KVPool(num_layers, num_kv_heads, head_dim, torch.float32, "cpu")
    cache = pool.allocate(capacity=600)            # a slot; cache.k / cache.v [num_layers, KV, capacity, hd] views
    step = pool.decode_step([cache_a, cache_b])    # once per decode step: rows, positions, key span
    o = step.attend(layer, q, k_new, v_new, scale) # writes the new keys/values, attends over the pool in place

Why a pool: batch-invariant attention reduces every query over whole 64-key tiles (modeling/attention.py).
With one tensor per sequence, a batched decode step had to copy each sequence's cache span into one stacked
tensor, per layer and per step (and ran one batch per distinct key span). Here all sequences live in
k, v [num_layers, num_slots, KV, capacity, hd]; a decode step attends over the view
`k[layer, lo:hi, :, :S]` (the slots of its rows, S = the longest key span among them) with one matmul
pair per layer and no copy of any cache. That every row may be reduced over S >= its own span is what
`attention.chunked_pv` guarantees (extra keys add exact zeros), so the result stays bit-identical to the
trainer's forward and to a decode alone.

Slots are handed out lowest-first and a decode step first moves caches of high slots into freed lower ones
(`compact`), so the rows of a step stay together; slots in lo..hi that are not rows of the step (a live
cache that is not decoding) compute a throw-away row. The pool grows (more slots, longer capacity: a new zeroed
tensor, live contents copied, caches see it at once because `cache.k` is a view taken on each access) and
is dropped when its last cache is released. A slot is zeroed when handed out, so keys past a row's
length are finite (they get probability 0). A cache's slot returns to the pool when the cache object is
garbage collected (the engine drops it when its request retires) or on `release()`.
"""

from __future__ import annotations

import heapq
import threading
import weakref

import torch
import torch.nn.functional as F

from flywheel.modeling.attention import ATTN_TILE, decode_attention, key_span, round_up
from flywheel.modeling.quant import fake_quant_kv

MIN_SLOTS = 8  # first pool size; doubles when full


class PooledKVCache:
    """One sequence's keys and values in a KVPool slot: k, v [num_layers, num_kv_heads, capacity, head_dim]
    (views into the pool), `length` positions filled. Same attributes as decoder.KVCache."""

    def __init__(self, pool: KVPool, slot: int, capacity: int):
        self.pool, self.slot, self.capacity, self.length = pool, slot, capacity, 0
        self._finalizer = weakref.finalize(self, pool._release, slot)

    @property
    def k(self) -> torch.Tensor:
        return self.pool.storage()[0][:, self.slot, :, :self.capacity]

    @property
    def v(self) -> torch.Tensor:
        return self.pool.storage()[1][:, self.slot, :, :self.capacity]

    def release(self) -> None:
        """Give the slot back now (idempotent); the cache must not be used afterwards."""
        self._finalizer()


class KVPool:
    """Growable pooled KV storage for the batch-invariant engine (see the module docstring)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device,
                 max_capacity: int | None = None, kv_dtype: str = "bf16"):
        fake_quant_kv(torch.zeros(1), kv_dtype)  # an unknown format fails here, not at the first write
        self.kv_dtype = kv_dtype  # inference.kv_dtype: K and V fake-quantized as they are written (modeling/quant.py)
        self.shape_tail = (num_kv_heads, head_dim)
        self.num_layers, self.dtype, self.device = num_layers, dtype, torch.device(device)
        self.max_capacity = None if max_capacity is None else round_up(max_capacity, ATTN_TILE)
        self.k: torch.Tensor | None = None  # [num_layers, num_slots, KV, capacity, hd]
        self.v: torch.Tensor | None = None
        self._free: list[int] = []  # heap of free slot indices below num_slots
        self._num_live = 0
        self._lock = threading.Lock()  # slots may be released from another thread (garbage collection)

    def quantize(self, t: torch.Tensor) -> torch.Tensor:
        """Keys or values [..., head_dim] as the cache stores them (`kv_dtype`; bf16 = as given)."""
        return t if self.kv_dtype == "bf16" else fake_quant_kv(t, self.kv_dtype)

    @property
    def num_slots(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[3]

    @property
    def num_live(self) -> int:
        return self._num_live

    def allocate(self, capacity: int) -> PooledKVCache:
        """A zeroed slot holding `capacity` positions (rounded up to whole key tiles)."""
        if capacity < 1:
            raise ValueError(f"a KV cache needs a capacity of at least 1 position, got {capacity}")
        cap = round_up(capacity, ATTN_TILE)
        with self._lock:
            if cap > self.capacity or not self._free:
                self._grow(cap)
            slot = heapq.heappop(self._free)
            self._num_live += 1
            pk, pv = self.storage()
            pk[:, slot].zero_()
            pv[:, slot].zero_()
        return PooledKVCache(self, slot, cap)

    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) [num_layers, num_slots, KV, capacity, hd]; only while a cache is live."""
        assert self.k is not None and self.v is not None, "the pool holds no cache"
        return self.k, self.v

    def _grow(self, cap: int) -> None:
        old_slots, old_cap = self.num_slots, self.capacity
        # capacity grows at least 2x (bounded by max_capacity) so that a run of longer requests re-copies rarely
        new_cap = old_cap if cap <= old_cap else max(cap, min(2 * old_cap, self.max_capacity or 2 * old_cap))
        new_slots = old_slots if self._free else max(MIN_SLOTS, 2 * old_slots)
        shape = (self.num_layers, new_slots, *self.shape_tail[:1], new_cap, self.shape_tail[1])
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if self.k is not None and self.v is not None:
            k[:, :old_slots, :, :old_cap] = self.k
            v[:, :old_slots, :, :old_cap] = self.v
        self.k, self.v = k, v
        for s in range(old_slots, new_slots):
            heapq.heappush(self._free, s)

    def _release(self, slot: int) -> None:
        with self._lock:
            heapq.heappush(self._free, slot)
            self._num_live -= 1
            if self._num_live == 0:  # idle: give the memory back; the next allocation starts small again
                self.k = self.v = None
                self._free = []

    def compact(self, caches: list[PooledKVCache]) -> int:
        """Move the caches of the highest slots into lower free ones, so that a decode step's slot range holds no
        freed slot (a step computes every slot of its range: after most of a batch has finished, its few rows
        would still pay for the whole range). Copies each moved cache's filled positions once; returns how many
        moved. The positions after a moved cache's length are zeroed, as in a slot handed out new."""
        moved = 0
        with self._lock:
            for c in sorted(caches, key=lambda c: c.slot, reverse=True):
                if not self._free or self._free[0] > c.slot:
                    break
                new = heapq.heappop(self._free)
                n = c.length
                for t in self.storage():
                    t[:, new, :, :n] = t[:, c.slot, :, :n]
                    t[:, new, :, n:c.capacity].zero_()
                c._finalizer.detach()
                heapq.heappush(self._free, c.slot)
                c.slot = new
                c._finalizer = weakref.finalize(c, self._release, new)
                moved += 1
        return moved

    def decode_step(self, caches: list[PooledKVCache], exact_tiles: bool = True) -> DecodeStep:
        """The layout of one decode step over `caches` (each fed at position cache.length). `exact_tiles`:
        batch-invariant attention (`attend`); False: one masked SDPA call per layer (`attend_sdpa`)."""
        return DecodeStep(self, caches, exact_tiles)


class DecodeStep:
    """Rows of one decode step on a pool: slot range lo..hi, positions, the longest key span S."""

    def __init__(self, pool: KVPool, caches: list[PooledKVCache], exact_tiles: bool = True):
        assert all(c.pool is pool for c in caches), "every cache of a decode step comes from this runner's pool"
        self.pool = pool
        slots = [c.slot for c in caches]
        positions = [c.length for c in caches]
        self.lo, self.hi = min(slots), max(slots) + 1
        # batch-invariant: whole key tiles; plain SDPA: exactly the keys of the longest row
        self.span = max(key_span(p) for p in positions) if exact_tiles else max(positions) + 1
        assert self.span <= pool.capacity
        device = pool.device
        self.slots_t = torch.tensor(slots, device=device)
        self.positions_t = torch.tensor(positions, device=device)
        # rows == the slots lo..hi in order: attend on the rows directly; else scatter into the slot range
        # (other slots of the range get position 0 and a zero query; their output is thrown away)
        self.rows = None if slots == list(range(self.lo, self.hi)) else self.slots_t - self.lo
        if self.rows is None:
            self.range_positions = self.positions_t
        else:
            self.range_positions = torch.zeros(self.hi - self.lo, dtype=torch.long, device=device)
            self.range_positions[self.rows] = self.positions_t
        # attend_sdpa's additive mask [hi - lo, 1, 1, span]: -inf on keys after the row's position (built once
        # per step: a boolean mask would be converted to this by every layer's SDPA call)
        self.mask = None
        if not exact_tiles:
            future = torch.arange(self.span, device=device) > self.range_positions[:, None]
            self.mask = torch.zeros(future.shape, dtype=pool.dtype, device=device).masked_fill_(future, float("-inf"))
            self.mask = self.mask[:, None, None]

    def _store(self, layer: int, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write k, v [B, KV, hd] at each row's position in `layer`; (q over the slot range lo..hi, zero rows for
        slots not in the step; the range's keys and values up to the longest row's span), views of the pool."""
        pool_k, pool_v = self.pool.storage()
        pk, pv = pool_k[layer], pool_v[layer]  # [num_slots, KV, capacity, hd]
        pk[self.slots_t, :, self.positions_t] = self.pool.quantize(k)
        pv[self.slots_t, :, self.positions_t] = self.pool.quantize(v)
        lo, hi, span = self.lo, self.hi, self.span
        if self.rows is not None:
            q = q.new_zeros(hi - lo, *q.shape[1:]).index_copy_(0, self.rows, q)
        return q, pk[lo:hi, :, :span], pv[lo:hi, :, :span]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Store k, v [B, KV, hd] at each row's position in `layer`, then attend q [B, H, hd] over the pool
        in place. Returns [B, H * hd]."""
        q, keys, values = self._store(layer, q, k, v)
        o = decode_attention(q, keys, values, self.range_positions, scale)
        return o if self.rows is None else o[self.rows]

    def attend_sdpa(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """`attend` for the default (not batch-invariant) mode: one masked SDPA call over the pool's slot range
        lo..hi and the longest row's keys, GQA without copies. q [B, H, hd] -> [B, H * hd]."""
        assert self.mask is not None, "attend_sdpa needs a step made with exact_tiles=False"
        q, keys, values = self._store(layer, q, k, v)
        o = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=self.mask, scale=scale,
                                           enable_gqa=True)  # [B', H, 1, hd]
        o = o.reshape(self.hi - self.lo, -1)
        return o if self.rows is None else o[self.rows]
