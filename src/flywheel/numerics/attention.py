"""Batch-invariant causal attention: one reduction order per query, however the queries are batched.

    k_len = key_span(pos)                                   # keys a query at `pos` reduces over (tile-rounded)
    o = attend(q, k, v, positions)                          # q [B, KV, R, M, hd] (pre-scaled), k/v [B, KV, L, hd]
    o = sequence_attention(q, k, v, scale)                  # trainer / prefill: q [B, T, H, hd], k/v [B, T, KV, hd]
    o = decode_attention(q, k_caches, v_caches, pos, scale) # engine decode: q [B, H, hd], caches [KV, cap, hd]

Why: the engine decodes one query at a time over its KV cache, prefills a prompt in one go, and the
trainer scores whole padded sequences. SDPA (and any fused kernel) picks its blocking from the shapes,
so the same token's attention output differs in the last bits between the three. Here every query at
position p is computed the same way in all of them:

* scores over exactly `key_span(p)` = p + 1 rounded up to ATTN_TILE keys (positions after p masked to
  -inf, so they add exact zeros), so the softmax and the P @ V reductions always have the same length;
* the matmuls run on row blocks that are a multiple of 8 rows (the CPU BLAS picks one kernel family for
  those: measured bit-identical per row for every M = 8k, 1 or 2 threads, MKL on AVX2; M = 1, 2, ... differ),
  with GQA folded into rows ([KV, R * M, hd] @ [KV, hd, L]), never a per-head copy of K;
* the scale is applied to q before the matmul (an exact elementwise multiply, identical everywhere).

The trainer and the prefill process queries tile by tile (all queries of a tile share one key span);
decode runs each row's query heads as the rows of a block padded to 8 rows and batches the rows whose key
spans are equal (one copy of their cache spans, one matmul pair). Everything is differentiable (the trainer's forward).
Measured costs are in docs/numerics.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTN_TILE = 64  # keys are reduced over spans that are multiples of this; queries are grouped by tile
ROW_BLOCK = 8  # query rows of one matmul are a multiple of this (one BLAS kernel family, one order)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def key_span(pos: int) -> int:
    """The number of keys a query at position `pos` reduces over: pos + 1 rounded up to ATTN_TILE."""
    return round_up(pos + 1, ATTN_TILE)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Masked attention of one query block. q [B, KV, R, M, hd] already scaled (M a multiple of ROW_BLOCK),
    k and v [B, KV, L, hd] with L = key_span of every query, positions [M] or [B, M] (key j is seen iff
    j <= pos).
    Keys after a query's position must be finite (they get probability exactly 0). Returns [B, KV, R, M, hd]."""
    b, kv, r, m, hd = q.shape
    span = k.shape[-2]
    assert m % ROW_BLOCK == 0, m
    s = torch.matmul(q.reshape(b, kv, r * m, hd), k.transpose(-1, -2)).view(b, kv, r, m, span)
    future = torch.arange(span, device=q.device) > positions[..., None]  # [M, L] or [B, M, L]
    if future.dim() == 3:
        future = future[:, None, None]  # [B, 1, 1, M, L]
    p = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
    return torch.matmul(p.view(b, kv, r * m, span), v).view(b, kv, r, m, hd)


def sequence_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention over whole sequences (positions 0..T-1), tile by tile.
    q [B, T, H, hd], k and v [B, T, KV, hd] -> o [B, T, H * hd]."""
    b, t, h, hd = q.shape
    kv = k.shape[2]
    r = h // kv
    t_pad = round_up(t, ATTN_TILE)
    qh = (q * scale).view(b, t, kv, r, hd).permute(0, 2, 3, 1, 4)  # [B, KV, R, T, hd]
    kh = F.pad(k.permute(0, 2, 1, 3), (0, 0, 0, t_pad - t))  # [B, KV, T_pad, hd], zeros after T
    vh = F.pad(v.permute(0, 2, 1, 3), (0, 0, 0, t_pad - t))
    outs = []
    for start in range(0, t, ATTN_TILE):
        rows = min(ATTN_TILE, t - start)
        m = round_up(rows, ROW_BLOCK)
        span = start + ATTN_TILE
        qt = qh[:, :, :, start:start + rows]
        if m != rows:
            qt = F.pad(qt, (0, 0, 0, m - rows))
        positions = torch.arange(start, start + m, device=q.device)
        outs.append(attend(qt, kh[:, :, :span], vh[:, :, :span], positions)[:, :, :, :rows])
    o = torch.cat(outs, dim=3)  # [B, KV, R, T, hd]
    return o.permute(0, 3, 1, 2, 4).reshape(b, t, h * hd)


def decode_attention(q: torch.Tensor, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                     positions: list[int], scale: float) -> torch.Tensor:
    """One query per row: row i at positions[i] over its cache (keys 0..pos filled, finite values - e.g.
    zeros - up to key_span(pos)). q [B, H, hd], k_caches[i] and v_caches[i] [KV, capacity, hd] -> [B, H * hd].

    Rows with the same key span run as one batch. A row's R = H / KV query heads of one KV group are the
    rows of its matmuls, padded with zero rows to a multiple of ROW_BLOCK (the trainer has R x 64 rows
    there; the BLAS gives each row the same result for any multiple of 8 rows)."""
    b, h, hd = q.shape
    kv = k_caches[0].shape[0]
    r = h // kv
    qs = (q * scale).view(b, kv, r, hd)
    if r % ROW_BLOCK:
        qs = F.pad(qs, (0, 0, 0, round_up(r, ROW_BLOCK) - r))  # [B, KV, RB, hd], zero rows after R
    spans: dict[int, list[int]] = {}
    for i, pos in enumerate(positions):
        spans.setdefault(key_span(pos), []).append(i)
    out = q.new_empty(b, kv, r, hd)
    for span, rows in spans.items():
        assert all(span <= k_caches[i].shape[1] for i in rows), "batch-invariant caches hold whole key tiles"
        k = torch.stack([k_caches[i][:, :span] for i in rows])  # [n, KV, L, hd]
        v = torch.stack([v_caches[i][:, :span] for i in rows])
        idx = torch.tensor(rows, device=q.device) if len(rows) < b else slice(None)
        s = torch.matmul(qs[idx], k.transpose(-1, -2))  # [n, KV, RB, L]
        pos = torch.tensor([positions[i] for i in rows], device=q.device)
        future = torch.arange(span, device=q.device) > pos[:, None]  # [n, L]
        p = torch.softmax(s.masked_fill(future[:, None, None], float("-inf")), dim=-1)
        out[idx] = torch.matmul(p, v)[:, :, :r]
    return out.view(b, h * hd)
