"""Batch-invariant causal attention: one reduction order per query, however the queries are batched.

    k_len = key_span(pos)                                   # keys a query at `pos` reduces over (tile-rounded)
    o = chunked_pv(p, v)                                    # P @ V in fixed 64-key chunks, ascending
    o = sequence_attention(q, k, v, scale)                  # trainer / prefill: q [B, T, H, hd], k/v [B, T, KV, hd]
    o = decode_attention(q, k, v, positions, scale)         # engine decode: q [B, H, hd], k/v [B, KV, S, hd] views

Why: the engine decodes one query at a time over its KV cache, prefills a prompt in one go, and the
trainer scores whole padded sequences. SDPA (and any fused kernel) picks its blocking from the shapes,
so the same token's attention output differs in the last bits between the three. Here every query at
position p is computed the same way in all of them:

* scores `(q * scale) @ K^T` over key_span(p) = p + 1 rounded up to ATTN_TILE keys or more, positions
  after p masked to -inf; a row softmax over them. Both are *extension-invariant*: extra keys after the
  span (finite, masked) change no bit of the scores of the first keys nor of the probabilities (measured:
  the score reduction runs over head_dim only; softmax's sums add exact zeros at the end);
* P @ V as a sum of 64-key chunk products `P[:, c] @ V[c]` added in ascending chunk order
  (`chunked_pv`). One matmul with K = the whole span is NOT extension-invariant (MKL blocks K by its
  length: K = 192 vs 384 differ in the last bit), a 64-key product is, and the extra chunks of a longer
  span add exact zeros (probability 0 times a finite value). So a query may be reduced over any
  tile-multiple number of keys >= its span and get the same bits: decode attends a whole batch over the
  longest span of the batch, in place on the KV pool (`modeling/kv_pool.py`), with no per-row copies;
* the matmuls run on row blocks that are a multiple of 8 rows (the CPU BLAS picks one kernel family for
  those: measured bit-identical per row for every M = 8k, 1 or 2 threads, MKL on AVX2; M = 1, 2, ... differ;
  with 2+ threads only in MKL's strict mode on some CPUs, modeling/blas.py),
  with GQA folded into rows ([KV, R * M, hd] @ [KV, hd, L]), never a per-head copy of K;
* the scale is applied to q before the matmul (an exact elementwise multiply, identical everywhere).

The trainer and the prefill go tile by tile (all queries of a tile share one key span; the causal mask
touches only the diagonal chunk; the prefill reads its keys from the zeroed cache, no padded copy);
decode runs each row's query heads as the rows of a block padded to 8 rows. Everything is
differentiable (the trainer's forward). Measured costs are in docs/numerics.md.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

ATTN_TILE = 64  # keys are reduced over spans that are multiples of this; queries are grouped by tile
ROW_BLOCK = 8  # query rows of one matmul are a multiple of this (one BLAS kernel family, one order)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def key_span(pos: int) -> int:
    """The number of keys a query at position `pos` reduces over: pos + 1 rounded up to ATTN_TILE."""
    return round_up(pos + 1, ATTN_TILE)


def chunked_pv(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """P @ V as the sum of 64-key chunk products in ascending chunk order. p [..., M, L], v [..., L, hd]
    with L a multiple of ATTN_TILE -> [..., M, hd]. A chunk where a row's p is all zero adds exact zeros to
    it, so a query's result does not depend on how many keys past its span are included."""
    span = p.shape[-1]
    assert span % ATTN_TILE == 0, span
    out = torch.matmul(p[..., :ATTN_TILE], v[..., :ATTN_TILE, :])
    for start in range(ATTN_TILE, span, ATTN_TILE):
        out = out + torch.matmul(p[..., start:start + ATTN_TILE], v[..., start:start + ATTN_TILE, :])
    return out


def sequence_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention over whole sequences (positions 0..T-1), one 64-query tile at a time.
    q [B, T, H, hd], k and v [B, T, KV, hd] -> o [B, T, H * hd]."""
    t = q.shape[1]
    t_keys = round_up(t, ATTN_TILE)
    kh = F.pad(k.permute(0, 2, 1, 3), (0, 0, 0, t_keys - t))  # [B, KV, T_keys, hd], zeros after T
    vh = F.pad(v.permute(0, 2, 1, 3), (0, 0, 0, t_keys - t))
    return _causal_tiles(q, kh, vh, scale)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float) -> torch.Tensor:
    """sequence_attention of one prompt over its KV cache, already written and zero after T (no padded
    copies). q [T, H, hd], k_cache and v_cache [KV, capacity >= T rounded up to ATTN_TILE, hd] -> [T, H * hd]."""
    t_keys = round_up(q.shape[0], ATTN_TILE)
    assert k_cache.shape[1] >= t_keys
    return _causal_tiles(q[None], k_cache[None, :, :t_keys], v_cache[None, :, :t_keys], scale)[0]


def _causal_tiles(q: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, T, H, hd], kh and vh [B, KV, T_keys, hd] (T rounded up to ATTN_TILE, finite after T).

    Query rows are laid out position-major ([B, KV, T * R, hd]: the R heads of a GQA group at one position
    are consecutive rows), padded to a multiple of 8 rows. The queries of tile i reduce over 64 (i + 1)
    keys; only the diagonal chunk needs the causal mask (the keys before it are all visible)."""
    b, t, h, hd = q.shape
    kv = kh.shape[1]
    r = h // kv
    t_rows = round_up(t, ROW_BLOCK // r if ROW_BLOCK % r == 0 else ROW_BLOCK)  # query positions, rows % 8 == 0
    qh = (q * scale).view(b, t, kv, r, hd)
    if t_rows != t:
        qh = F.pad(qh, (0, 0, 0, 0, 0, 0, 0, t_rows - t))
    qh = qh.permute(0, 2, 1, 3, 4).reshape(b, kv, t_rows * r, hd)  # [B, KV, T_rows * R, hd], position-major
    diag_future = _diagonal_mask(r, q.device)  # [64 R, 64]
    outs = []
    for s0 in range(0, t_rows, ATTN_TILE):
        span = s0 + ATTN_TILE
        rows = slice(s0 * r, min(span, t_rows) * r)
        s = torch.matmul(qh[:, :, rows], kh[:, :, :span].transpose(-1, -2))  # [B, KV, rows, span]
        s[..., s0:].masked_fill_(diag_future[:s.shape[2]], float("-inf"))  # in place: matmul saves no output
        p = torch.softmax(s, dim=-1)
        outs.append(chunked_pv(p, vh[:, :, :span]))
    o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # [B, KV, T_rows * R, hd]
    return o.view(b, kv, t_rows, r, hd)[:, :, :t].permute(0, 2, 1, 3, 4).reshape(b, t, h * hd)


@functools.lru_cache(maxsize=32)
def _diagonal_mask(r: int, device: torch.device) -> torch.Tensor:
    """[64 R, 64] bool, True where key j of a tile comes after the position of query row i (R rows per position)."""
    with torch.inference_mode(False):  # a normal tensor: cached, then used by the engine and by autograd alike
        local = torch.arange(ATTN_TILE, device=device)
        return local > local.repeat_interleave(r)[:, None]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One query per row over that row's keys, all rows in one batch. q [B, H, hd]; k and v [B, KV, S, hd]
    (S a multiple of ATTN_TILE and >= key_span of every row; keys after a row's position finite; any
    strides, e.g. views of a KV pool); positions [B] long -> [B, H * hd].

    A row's R = H / KV query heads of one KV group are the rows of its matmuls, padded with zero rows to a
    multiple of ROW_BLOCK (the trainer has R x 64 rows there; the BLAS gives each row the same result for
    any multiple of 8 rows). Keys past a row's own span get probability 0 and add exact zeros."""
    b, h, hd = q.shape
    kv, span = k.shape[1], k.shape[2]
    r = h // kv
    assert span % ATTN_TILE == 0, span
    qs = (q * scale).view(b, kv, r, hd)
    if r % ROW_BLOCK:
        qs = F.pad(qs, (0, 0, 0, round_up(r, ROW_BLOCK) - r))  # [B, KV, RB, hd], zero rows after R
    s = torch.matmul(qs, k.transpose(-1, -2))  # [B, KV, RB, S]
    future = torch.arange(span, device=q.device) > positions[:, None]  # [B, S]
    p = torch.softmax(s.masked_fill(future[:, None, None], float("-inf")), dim=-1)
    return chunked_pv(p, v)[:, :, :r].reshape(b, h * hd)
