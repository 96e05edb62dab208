"""Lossless delta codec for weight chunks: version v of a tensor slice against version v-1.

    blob = encode_chunk(new_u16, old_u16)          # 1-D unsigned-int views of the same slice
    out = np.empty_like(new_u16); decode_chunk(blob, old_u16, out)
    assert (out == new_u16).all()                   # bit-exact, NaN payloads and -0.0 included

Why it is built so. An RL step in bf16 changes ~1-4 % of the weights, and a changed weight mostly
moves by one or two units in the last place. So a delta chunk stores (a) the *positions* of the
changed elements as gaps, Rice-style split into a low part of `k` bits (near-uniform, `k` picked
from the mean gap) and a small high part (geometric, a few bits), each as its own byte plane, and
(b) the *values* as the wrapping integer difference new-old of the raw bits, zigzag-coded (a +-1 ulp
move is 1 bit of entropy; XOR would spend ~2 bits on carry runs); the high gap part and small values
share one symbol byte per changed element, larger ones escape to side lists.
Every plane goes through zstandard, whose Huffman stage then codes each plane near its zeroth-order
entropy: ~8-10 bits per changed element at 0.5-2 % density, about 100x smaller than the model.
A chunk with many changes falls back to dense zigzag planes; a chunk with no base (an anchor) is
stored as byte planes of the bits rotated left by one, which puts the exponent in its own plane
(zipnn's exponent grouping). Differences are taken on the raw bits, never on float values, so the
round trip is exact for every bit pattern. Chunks are independent, so threads encode and decode
them in parallel (numpy and zstandard release the GIL).

Chunk layout: header `<4sBBBBQQH` (magic, mode, itemsize, k, 0, num_elements, num_changed,
num_sections), then per section `<BI` (0 = raw, 1 = zstd; length), then the section payloads.
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import zstandard

MAGIC = b"FWC1"
MODE_ANCHOR = 0  # rotated byte planes of the new values
MODE_SPARSE = 1  # gap-coded positions + zigzag value planes
MODE_DENSE = 2  # zigzag difference planes of every element
_HEADER = struct.Struct("<4sBBBBQQH")
_SECTION = struct.Struct("<BI")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
DENSE_FRACTION = 0.25  # above this changed fraction a chunk is coded densely
_Q_ESC = 31  # gap high part >= this is escaped to a uint32 side list
_V_ESC = 7  # zigzag value code 7 (z >= 8) is escaped to side planes

_local = threading.local()


class CodecError(ValueError):
    """A chunk is truncated, corrupt, or does not fit the base it is applied to."""


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "dctx", None)
    if d is None:
        d = _local.dctx = zstandard.ZstdDecompressor()
    return d


def _planes(x: np.ndarray, num_planes: int | None = None) -> list[np.ndarray]:
    """Byte planes of a 1-D unsigned array, least significant first (little-endian)."""
    size = x.dtype.itemsize
    b = x.view(np.uint8).reshape(-1, size)
    return [np.ascontiguousarray(b[:, i]) for i in range(size if num_planes is None else num_planes)]


def _join(planes: list[np.ndarray], dtype: type, n: int) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    b = np.zeros((n, size), np.uint8)
    for i, p in enumerate(planes):
        b[:, i] = p
    return b.reshape(-1).view(dtype)


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << x.dtype.type(1)) | (x >> x.dtype.type(bits - 1))


def _rotr(x: np.ndarray, bits: int) -> np.ndarray:
    return (x >> x.dtype.type(1)) | (x << x.dtype.type(bits - 1))


def _zigzag(d: np.ndarray, bits: int) -> np.ndarray:
    s = d.view(_INT[bits // 8])
    return ((s << 1) ^ (s >> (bits - 1))).view(d.dtype)


def _unzigzag(z: np.ndarray, bits: int) -> np.ndarray:
    one = z.dtype.type(1)
    return ((z >> one) ^ (~(z & one) + one)).view(z.dtype)


def _pack(mode: int, itemsize: int, k: int, n: int, num_changed: int, sections: list[bytes], level: int) -> bytes:
    cctx = _compressor(level)
    heads, bodies = [], []
    for raw in sections:
        comp = cctx.compress(raw) if len(raw) >= 64 else raw
        if len(comp) < len(raw):
            heads.append(_SECTION.pack(1, len(comp)))
            bodies.append(comp)
        else:
            heads.append(_SECTION.pack(0, len(raw)))
            bodies.append(raw)
    return b"".join([_HEADER.pack(MAGIC, mode, itemsize, k, 0, n, num_changed, len(sections)), *heads, *bodies])


def _unpack(blob: bytes) -> tuple[int, int, int, int, int, list[bytes]]:
    if len(blob) < _HEADER.size:
        raise CodecError(f"chunk is truncated: {len(blob)} bytes, header needs {_HEADER.size}")
    magic, mode, itemsize, k, _, n, num_changed, num_sections = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise CodecError(f"chunk does not start with {MAGIC!r} (got {magic!r}); it is not a flywheel weight chunk")
    if mode not in (MODE_ANCHOR, MODE_SPARSE, MODE_DENSE) or itemsize not in _UINT or num_changed > n:
        raise CodecError(f"chunk header is corrupt (mode {mode}, itemsize {itemsize}, {num_changed}/{n} changed)")
    off = _HEADER.size
    if len(blob) < off + num_sections * _SECTION.size:
        raise CodecError("chunk is truncated inside its section table")
    heads = [_SECTION.unpack_from(blob, off + i * _SECTION.size) for i in range(num_sections)]
    off += num_sections * _SECTION.size
    sections = []
    dctx = _decompressor()
    for flag, length in heads:
        body = blob[off:off + length]
        if len(body) != length:
            raise CodecError(f"chunk is truncated: a section needs {length} bytes, {len(body)} remain")
        off += length
        if flag == 1:
            try:
                body = dctx.decompress(body)
            except zstandard.ZstdError as err:
                raise CodecError(f"chunk section does not decompress: {err}") from None
        elif flag != 0:
            raise CodecError(f"chunk section flag {flag} is unknown")
        sections.append(body)
    if off != len(blob):
        raise CodecError(f"chunk has {len(blob) - off} trailing bytes")
    return mode, itemsize, k, n, num_changed, sections


def encode_chunk(new: np.ndarray, old: np.ndarray | None, level: int = 3) -> bytes:
    """Encode `new` (1-D unsigned view) against `old` (same shape and dtype), or as an anchor if None."""
    if new.ndim != 1 or new.dtype.type not in _UINT.values():
        raise TypeError(f"encode_chunk wants a 1-D unsigned-int view, got {new.dtype} with shape {new.shape}")
    size, n = new.dtype.itemsize, new.shape[0]
    bits = 8 * size
    if old is None:
        planes = _planes(_rotl(new, bits))
        return _pack(MODE_ANCHOR, size, 0, n, n, [p.tobytes() for p in planes], level)
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"base chunk is {old.dtype}{tuple(old.shape)}, new chunk is {new.dtype}{tuple(new.shape)}")
    pos = np.flatnonzero(new != old)
    m = pos.shape[0]
    if m > DENSE_FRACTION * n:
        z = _zigzag(new - old, bits)
        return _pack(MODE_DENSE, size, 0, n, m, [p.tobytes() for p in _planes(z)], level)
    if m == 0:
        return _pack(MODE_SPARSE, size, 0, n, 0, [], level)
    gaps = np.diff(pos, prepend=-1).astype(np.uint32) - np.uint32(1)
    # Rice split: k low bits near-uniform; the high part q (geometric, mean ~1.4) and the value's
    # zigzag code z share one symbol byte (q:5 bits | z-1:3 bits), so Huffman codes them jointly
    # near their entropy (~3 bits) instead of paying its 1-bit floor twice. Escapes go to side lists.
    mean_gap = (n - m) / m
    k = max(0, min(31, int(np.floor(np.log2(max(mean_gap * 0.69, 1.0))))))
    high = gaps >> np.uint32(k)
    z = _zigzag(new[pos] - old[pos], bits)
    q_code = np.minimum(high, _Q_ESC).astype(np.uint8)
    v_code = (np.minimum(z, _V_ESC + 1) - 1).astype(np.uint8)
    sym = (q_code << np.uint8(3)) | v_code
    q_exc = high[q_code == _Q_ESC].astype(np.uint32)
    v_exc = z[v_code == _V_ESC]
    low = gaps & np.uint32((1 << k) - 1)
    sections = [sym.tobytes(), q_exc.tobytes(), *(p.tobytes() for p in _planes(low, (k + 7) // 8)),
                *(p.tobytes() for p in _planes(v_exc))]
    return _pack(MODE_SPARSE, size, k, n, m, sections, level)


def decode_chunk(blob: bytes, old: np.ndarray | None, out: np.ndarray) -> np.ndarray:
    """Decode `blob` into `out` (1-D unsigned view, written in full); `old` is the base slice for deltas."""
    mode, size, k, n, m, sec = _unpack(blob)
    if out.dtype.itemsize != size or out.shape != (n,):
        raise CodecError(f"chunk holds {n} elements of {size} bytes; the tensor slice is {out.dtype}{tuple(out.shape)}")
    udt = _UINT[size]
    bits = 8 * size

    def plane(i: int, length: int) -> np.ndarray:
        if i >= len(sec) or len(sec[i]) != length:
            raise CodecError(f"chunk section {i} has the wrong length; the chunk is corrupt")
        return np.frombuffer(sec[i], np.uint8)

    if mode == MODE_ANCHOR:
        if len(sec) != size:
            raise CodecError("anchor chunk has the wrong number of planes")
        out[:] = _rotr(_join([plane(i, n) for i in range(size)], udt, n), bits)
        return out
    if old is None:
        raise CodecError("a delta chunk needs its base version; none was given")
    if old.shape != out.shape or old.dtype.itemsize != size:
        raise CodecError(f"delta chunk does not fit its base slice {old.dtype}{tuple(old.shape)}")
    if mode == MODE_DENSE:
        if len(sec) != size:
            raise CodecError("dense chunk has the wrong number of planes")
        z = _join([plane(i, n) for i in range(size)], udt, n)
        np.add(old, _unzigzag(z, bits), out=out)
        return out
    out[:] = old
    if m == 0:
        return out
    num_low = (k + 7) // 8
    if len(sec) != 2 + num_low + size or len(sec[1]) % 4:
        raise CodecError("sparse chunk has the wrong number of sections")
    sym = plane(0, m)
    high = (sym >> np.uint8(3)).astype(np.uint32)
    q_at = np.flatnonzero(high == _Q_ESC)
    q_exc = np.frombuffer(sec[1], np.uint32)
    if q_exc.shape[0] != q_at.shape[0]:
        raise CodecError("sparse chunk gap escapes do not match; the chunk is corrupt")
    high[q_at] = q_exc
    low = _join([plane(2 + i, m) for i in range(num_low)], np.uint32, m) if num_low else np.uint32(0)
    pos = np.cumsum((high << np.uint32(k)) | low, dtype=np.int64) + np.arange(m, dtype=np.int64)
    if pos[-1] >= n:
        raise CodecError(f"sparse chunk positions run past the slice ({pos[-1]} >= {n}); the chunk is corrupt")
    v_code = sym & np.uint8(7)
    z = v_code.astype(udt) + udt(1)
    v_at = np.flatnonzero(v_code == _V_ESC)
    z[v_at] = _join([plane(2 + num_low + i, v_at.shape[0]) for i in range(size)], udt, v_at.shape[0])
    out[pos] = old[pos] + _unzigzag(z, bits)
    return out


def chunk_ranges(num_elements: int, itemsize: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of at most `chunk_bytes` each (at least one, even for empty tensors)."""
    step = max(1, chunk_bytes // itemsize)
    return [(s, min(s + step, num_elements)) for s in range(0, num_elements, step)] or [(0, 0)]
