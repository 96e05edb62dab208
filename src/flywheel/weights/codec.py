"""Lossless delta codec for weight chunks: version v of a tensor slice against version v-1.

    blob = encode_chunk(new_u16, old_u16)          # 1-D unsigned-int views of the same slice
    out = np.empty_like(new_u16); decode_chunk(blob, old_u16, out)
    assert (out == new_u16).all()                   # bit-exact, NaN payloads and -0.0 included

Why it is built so. An RL step in bf16 changes ~1-10 % of the weights, and a changed weight mostly
moves by one or two units in the last place. So a delta chunk stores, per changed element, one
*symbol byte* and `k` raw bits:

* the position, as the gap to the previous change, Rice-split into `k` low bits (near-uniform, so
  they are bit-packed raw: no entropy coder can win there and packing is ~free) and a high part
  (geometric, mean ~2-3 with `k = floor(log2(mean_gap / 2))`), 5 bits of the symbol (31 = escape
  to a side list);
* the value, as the wrapping integer difference new-old of the raw bits, zigzag-coded (a +-1 ulp
  move is 1 bit of entropy; XOR would spend ~2 bits on carry runs), 3 bits of the symbol (z-1,
  7 = escape to side byte planes).

Only the symbol stream is entropy-coded, by zstandard with match finding turned down to nothing
(min_match 7, a 64-entry hash): the stream is nearly memoryless, so LZ matching at level 3 spent most
of the encode time finding short spurious matches and *grew* the output; with it off zstd is just its
Huffman stage, which codes the joint (gap, value) symbol near its zeroth-order entropy. Result at
lr 1e-6 / 3e-6 / 1e-5 (1.7 / 4 / 11 % changed): ~9.3 / 8.1 / 6.9 bits per changed element.

Speed. The per-change work runs in two compiled loops (codec_kernels.py, numba, GIL released): the
encoder walks the set bits of `np.packbits(new != old)` (both SIMD numpy passes), so its cost is per
*change*, not per element; the decoder copies the base and rewrites only the changed elements. In
numpy the same format took ~25 whole-array passes over the changes plus `flatnonzero`'s ~1 ns per
element, which kept 4-10 % deltas under 1 GB/s on one core. The low gap bits are packed by
`pack_bits` (numpy, vectorised per bit field) and big temporaries live in per-thread scratch buffers.

A chunk with more than DENSE_FRACTION changes falls back to dense zigzag byte planes; a chunk with no
base (an anchor) is stored as byte planes of the bits rotated left by one, which puts the exponent in
its own plane (zipnn's exponent grouping); both use the caller's zstd `level`. Differences are taken
on the raw bits, never on float values, so the round trip is exact for every bit pattern. Chunks are
independent, so threads encode and decode them in parallel (numpy and zstandard release the GIL).

Chunk layout: header `<4sBBBBQQH` (magic, mode, itemsize, k, 0, num_elements, num_changed,
num_sections), then per section `<BI` (0 = raw, 1 = zstd; length), then the section payloads.
Modes: 0 anchor, 1 sparse (the first format: low gap bits as zstd byte planes; still decoded so
older stores stay readable), 2 dense, 3 sparse with packed low bits (written now).
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import zstandard

from flywheel.weights.codec_kernels import decode_sparse, encode_sparse

MAGIC = b"FWC1"
MODE_ANCHOR = 0  # rotated byte planes of the new values
MODE_SPARSE_V1 = 1  # first sparse format (decode only): sections sym, q_exc, low planes, v_exc planes
MODE_DENSE = 2  # zigzag difference planes of every element
MODE_SPARSE = 3  # sections: sym (zstd, entropy only), packed low bits (raw), q_exc, v_exc planes
_MODES = (MODE_ANCHOR, MODE_SPARSE_V1, MODE_DENSE, MODE_SPARSE)
_HEADER = struct.Struct("<4sBBBBQQH")
_SECTION = struct.Struct("<BI")
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
DENSE_FRACTION = 0.75  # above this changed fraction a chunk is coded densely (sparse wins below, see docs)
_Q_ESC = 31  # gap high part >= this is escaped to a side list (5 bits of the symbol)
_V_ESC = 7  # zigzag value code 7 (z >= 8) is escaped to side planes (3 bits of the symbol)
_MIN_ZSTD = 64  # sections shorter than this are stored raw
# Symbol streams are memoryless: zstd with matching made inert is its Huffman stage alone (faster than
# level 1 and smaller than level 3, which finds short spurious matches in low-entropy bytes).
_ENTROPY_PARAMS = dict(window_log=17, hash_log=6, chain_log=6, search_log=1, min_match=7, target_length=0,
                       strategy=1, write_content_size=True)

_HAS_POPCOUNT = hasattr(np, "bitwise_count")  # numpy >= 2.0; else count the unpacked booleans
_local = threading.local()


class CodecError(ValueError):
    """A chunk is truncated, corrupt, or does not fit the base it is applied to."""


def _compressor(level: int | None) -> zstandard.ZstdCompressor:
    """Per-thread compressor for `level`; None = the entropy-only parameter set for symbol streams."""
    cache = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    if level not in cache:
        if level is None:
            cache[None] = zstandard.ZstdCompressor(
                compression_params=zstandard.ZstdCompressionParameters(**_ENTROPY_PARAMS))
        else:
            cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return cache[level]


def _scratch(name: str, num: int, dtype: type) -> np.ndarray:
    """A per-thread reusable buffer of at least `num` elements: big temporaries allocated afresh for
    every chunk cost page faults (expensive in VMs) and their first touch; reused ones are warm."""
    bufs = getattr(_local, "scratch", None)
    if bufs is None:
        bufs = _local.scratch = {}
    buf = bufs.get(name)
    if buf is None or buf.shape[0] < num or buf.dtype != dtype:
        buf = bufs[name] = np.empty(num, dtype)
    return buf[:num]


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


def _bit_fields(k: int) -> list[tuple[int, int]]:
    """(shift, width) of the fields `pack_bits` splits `k` bits into: whole bytes, then 4, 2, 1 bits."""
    fields = [(8 * i, 8) for i in range(k // 8)]
    shift = 8 * (k // 8)
    for w in (4, 2, 1):
        if k % 8 & w:
            fields.append((shift, w))
            shift += w
    return fields


def packed_bits_len(num: int, k: int) -> int:
    """Bytes `pack_bits` writes for `num` values of `k` bits."""
    return sum(-(-num * w // 8) for _, w in _bit_fields(k))


def _pack_field(f: np.ndarray, w: int) -> np.ndarray:
    """uint8 values < 2**w, w in (1, 2, 4), packed 8 // w to a byte (first value in the low bits)."""
    if w == 1:
        return np.packbits(f, bitorder="little")
    per = 8 // w
    num = f.shape[0]
    if num % per:
        f = np.concatenate([f, np.zeros(per - num % per, np.uint8)])
    # multiply-shift gathers the bytes' low bits into the top byte (no carries: the partial products
    # land on disjoint bit ranges, and those past the word's width fall off)
    u: np.ndarray
    if w == 2:
        u = f.view("<u4") * np.uint32(0x01041040)
        return (u >> np.uint32(24)).astype(np.uint8)
    u = f.view("<u2") * np.uint16(0x0110)
    return (u >> np.uint16(8)).astype(np.uint8)


def _spread_field(b: np.ndarray, w: int) -> np.ndarray:
    """Inverse of `_pack_field` for w in (2, 4): each byte's 8 // w fields, one per output byte.

    Shift-or copies of the byte land each field in its own byte of a wider word, a mask keeps it
    (the same bit-deposit trick as the packing multiply, run backwards); no per-byte loop."""
    if w == 2:
        y = b.astype("<u4")
        y |= (y << np.uint32(6)) | (y << np.uint32(12)) | (y << np.uint32(18))
        y &= np.uint32(0x03030303)
    else:
        y = b.astype("<u2")
        y |= y << np.uint16(4)
        y &= np.uint16(0x0F0F)
    return y.view(np.uint8)


def pack_bits(x: np.ndarray, k: int) -> np.ndarray:
    """The low `k` bits of each value of unsigned `x`, packed densely into uint8 (inverse: `unpack_bits`).

    Bits go in fields (whole bytes, then 4, 2, 1 bits) so that each field packs with one vectorised
    step (a byte cast, a multiply-shift, `np.packbits`) and unpacks with one broadcast shift."""
    parts = []
    for shift, w in _bit_fields(k):
        f = (x >> x.dtype.type(shift) if shift else x).astype(np.uint8)
        if w < 8:
            f &= np.uint8((1 << w) - 1)
        parts.append(f if w == 8 else _pack_field(f, w))
    return np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, np.uint8)


def unpack_bits(buf: np.ndarray, k: int, num: int, dtype: type = np.uint32) -> np.ndarray:
    """`num` values of `k` bits from uint8 `buf` (length `packed_bits_len(num, k)`), as `dtype`
    (as uint8 when k <= 8, which ORs into any wider integer array without a copy of its own)."""
    out: np.ndarray | None = None
    off = 0
    for shift, w in _bit_fields(k):
        nbytes = -(-num * w // 8)
        b = buf[off:off + nbytes]
        off += nbytes
        if w == 8:
            f = b
        elif w == 1:
            f = np.unpackbits(b, count=num, bitorder="little")
        else:
            f = _spread_field(b, w)[:num]
        if out is None:
            out = f.astype(np.uint8 if k <= 8 else dtype)  # a copy: `f` may be a view of `buf`
        else:
            out |= f.astype(out.dtype) << out.dtype.type(shift)
    return np.zeros(num, np.uint8) if out is None else out


def _pack(mode: int, itemsize: int, k: int, n: int, num_changed: int, sections: list, level: int) -> bytes:
    """Frame `sections`: each is a buffer (zstd at `level`, kept raw if that does not shrink it) or a
    pair (buffer, how) with how = "raw" (never compressed) or "entropy" (the entropy-only zstd)."""
    heads: list[bytes] = []
    bodies: list[bytes | memoryview] = []
    for s in sections:
        raw, how = s if isinstance(s, tuple) else (s, level)
        raw = np.ascontiguousarray(raw).data.cast("B") if isinstance(raw, np.ndarray) else memoryview(raw)
        comp = None
        if how != "raw" and raw.nbytes >= _MIN_ZSTD:
            comp = _compressor(None if how == "entropy" else how).compress(raw)
        if comp is not None and len(comp) < raw.nbytes:
            heads.append(_SECTION.pack(1, len(comp)))
            bodies.append(comp)
        else:
            heads.append(_SECTION.pack(0, raw.nbytes))
            bodies.append(raw)
    return b"".join([_HEADER.pack(MAGIC, mode, itemsize, k, 0, n, num_changed, len(sections)), *heads, *bodies])


def _unpack(blob: bytes) -> tuple[int, int, int, int, int, list]:
    if len(blob) < _HEADER.size:
        raise CodecError(f"chunk is truncated: {len(blob)} bytes, header needs {_HEADER.size}")
    magic, mode, itemsize, k, _, n, num_changed, num_sections = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise CodecError(f"chunk does not start with {MAGIC!r} (got {magic!r}); it is not a flywheel weight chunk")
    if mode not in _MODES or itemsize not in _UINT or num_changed > n:
        raise CodecError(f"chunk header is corrupt (mode {mode}, itemsize {itemsize}, {num_changed}/{n} changed)")
    off = _HEADER.size
    if len(blob) < off + num_sections * _SECTION.size:
        raise CodecError("chunk is truncated inside its section table")
    heads = [_SECTION.unpack_from(blob, off + i * _SECTION.size) for i in range(num_sections)]
    off += num_sections * _SECTION.size
    view = memoryview(blob)
    sections = []
    dctx = _decompressor()
    for flag, length in heads:
        body: bytes | memoryview = view[off:off + length]
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


def _gap_dtype(n: int) -> type:
    return np.uint32 if n < 2**31 else np.uint64


def encode_chunk(new: np.ndarray, old: np.ndarray | None, level: int = 3) -> bytes:
    """Encode `new` (1-D unsigned view) against `old` (same shape and dtype), or as an anchor if None.

    `level` is the zstd level of anchor and dense planes and of the escape lists; the sparse symbol
    stream always uses the entropy-only parameters (see the module docstring)."""
    if new.ndim != 1 or new.dtype.type not in _UINT.values():
        raise TypeError(f"encode_chunk wants a 1-D unsigned-int view, got {new.dtype} with shape {new.shape}")
    size, n = new.dtype.itemsize, new.shape[0]
    bits = 8 * size
    if old is None:
        return _pack(MODE_ANCHOR, size, 0, n, n, _planes(_rotl(new, bits)), level)
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"base chunk is {old.dtype}{tuple(old.shape)}, new chunk is {new.dtype}{tuple(new.shape)}")
    num_pad = -(-n // 64) * 64  # whole uint64 words of change bits
    ne_buf = _scratch("ne", num_pad, np.bool_)
    ne_buf[n:] = False
    np.not_equal(new, old, out=ne_buf[:n])
    words = np.packbits(ne_buf, bitorder="little").view("<u8")
    m = int(np.bitwise_count(words).sum(dtype=np.int64)) if _HAS_POPCOUNT else int(np.count_nonzero(ne_buf))
    if m > DENSE_FRACTION * n:
        return _pack(MODE_DENSE, size, 0, n, m, _planes(_zigzag(new - old, bits)), level)
    if m == 0:
        return _pack(MODE_SPARSE, size, 0, n, 0, [], level)
    gdt = _gap_dtype(n)
    k = max(0, min(8 * np.dtype(gdt).itemsize - 1, int(np.log2(max((n - m) / m * 0.5, 1.0)))))
    sym = np.empty(m, np.uint8)
    low: np.ndarray = np.empty(m, np.uint8 if k <= 8 else gdt)
    q_exc: np.ndarray = np.empty(m, gdt)
    v_exc = np.empty(m, new.dtype)
    num_q, num_v = encode_sparse(words, new, old, k, sym, low, q_exc, v_exc)
    sections = [(sym, "entropy"), (pack_bits(low, k), "raw"), q_exc[:num_q], np.concatenate(_planes(v_exc[:num_v]))]
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
    if m == 0:
        out[:] = old
        return out
    if mode == MODE_SPARSE_V1:
        out[:] = old
        return _decode_sparse_v1(sec, plane, old, out, k, n, m, size)
    gdt = _gap_dtype(n)
    if len(sec) != 4 or len(sec[2]) % np.dtype(gdt).itemsize or k >= 8 * np.dtype(gdt).itemsize:
        raise CodecError("sparse chunk has the wrong sections; the chunk is corrupt")
    sym = plane(0, m)
    low = unpack_bits(plane(1, packed_bits_len(m, k)), k, m, gdt) if k else np.zeros(m, np.uint8)
    q_exc: np.ndarray = np.frombuffer(sec[2], gdt)
    if len(sec[3]) % size:
        raise CodecError("sparse chunk value escapes have a partial element; the chunk is corrupt")
    num_v = len(sec[3]) // size
    vx = np.frombuffer(sec[3], np.uint8)
    v_exc = _join([vx[i * num_v:(i + 1) * num_v] for i in range(size)], udt, num_v)
    out[:] = old
    if decode_sparse(sym, low, k, q_exc, v_exc, old, out) < 0:
        raise CodecError("sparse chunk positions or escapes do not fit the slice; the chunk is corrupt")
    return out


def _decode_sparse_v1(sec: list, plane, old: np.ndarray, out: np.ndarray, k: int, n: int, m: int,
                      size: int) -> np.ndarray:
    """Mode 1 (the first sparse format): low gap bits as zstd byte planes, one section per plane."""
    udt = _UINT[size]
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
    out[pos] = old[pos] + _unzigzag(z, 8 * size)
    return out


def chunk_num_changed(blob: bytes) -> int:
    """Elements a delta chunk changes (its header's count; the element count for an anchor chunk)."""
    return int(_HEADER.unpack_from(blob, 0)[6])


def chunk_ranges(num_elements: int, itemsize: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of at most `chunk_bytes` each (at least one, even for empty tensors)."""
    step = max(1, chunk_bytes // itemsize)
    return [(s, min(s + step, num_elements)) for s in range(0, num_elements, step)] or [(0, 0)]
