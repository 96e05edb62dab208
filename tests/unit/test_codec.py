"""The delta codec: bit-exact round trips over dtypes, shapes, special payloads and sparsity; size; bad input."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.weights.codec import CodecError, decode_chunk, encode_chunk
from flywheel.weights.tensors import bits_hash, decode_tensor, encode_tensor, from_bits, to_bits

DTYPES = ["bfloat16", "float16", "float32", "float64"] + [
    d for d in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, d)]
SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-40, -1.0]


def _tensor(rng, dtype, n, special_frac):
    t = torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 0.02).to(getattr(torch, dtype))
    bits = to_bits(t).copy()
    idx = rng.choice(n, int(n * special_frac), replace=False) if n else []
    for i in idx:  # inject NaN/Inf/-0.0, plus raw NaN payloads with random mantissa bits
        bits[i] = to_bits(torch.tensor([SPECIALS[i % len(SPECIALS)]]).to(t.dtype))[0]
    if n and t.element_size() >= 2:
        nan = to_bits(torch.tensor([float("nan")]).to(t.dtype))[0]
        bits[idx[: len(idx) // 2]] = nan | bits.dtype.type(rng.integers(1, 7))
    return bits


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), n=st.integers(0, 5000), frac=st.sampled_from([0.0, 1e-3, 0.02, 0.3, 1.0]),
       special=st.floats(0, 0.2), chunk=st.sampled_from([16, 1000, 1 << 20]), seed=st.integers(0, 2**31))
def test_roundtrip_bit_exact(dtype, n, frac, special, chunk, seed):
    rng = np.random.default_rng(seed)
    old = _tensor(rng, dtype, n, special)
    new = old.copy()
    k = int(n * frac)
    idx = rng.choice(n, k, replace=False) if k else np.zeros(0, np.int64)
    # mostly +-1 ulp, some big jumps and sign flips (wrapping arithmetic on the raw bits)
    steps = rng.choice(np.array([1, -1, 2, -3, 1000, -(1 << (8 * new.dtype.itemsize - 1))], np.int64), size=k)
    new[idx] = (new[idx].astype(np.int64) + steps).astype(new.dtype)
    for base in (old, None):
        blobs = encode_tensor(new, base, chunk, 3)
        out = decode_tensor(blobs, base, n, new.dtype.itemsize, max(1, chunk // new.dtype.itemsize))
        assert bits_hash(out) == bits_hash(new)
        assert np.array_equal(out, new)
    t = from_bits(out, dtype, (n,))
    assert t.dtype == getattr(torch, dtype) and np.array_equal(to_bits(t), new)


def test_small_rl_like_delta_is_about_one_byte_per_changed_weight():
    rng = np.random.default_rng(0)
    old = to_bits(torch.from_numpy(rng.standard_normal(1 << 20).astype(np.float32) * 0.02).bfloat16()).copy()
    new = old.copy()
    idx = rng.choice(old.shape[0], old.shape[0] // 100, replace=False)  # 1 % changed by +-1 ulp
    new[idx] += rng.choice(np.array([1, 0xFFFF], np.uint16), idx.shape[0])
    blob = encode_chunk(new, old)
    assert len(blob) / idx.shape[0] < 1.3  # entropy: ~8.1 bits for positions + 1 bit of sign
    anchor = encode_chunk(new, None)
    assert len(anchor) < 0.85 * new.nbytes  # exponent plane compresses


def test_unchanged_chunk_is_tiny():
    x = np.arange(100_000, dtype=np.uint16)
    assert len(encode_chunk(x, x.copy())) < 40


def test_corrupt_and_truncated_chunks_are_refused():
    rng = np.random.default_rng(1)
    old = rng.integers(0, 1 << 16, 50_000, dtype=np.uint16)
    new = old.copy()
    new[::97] += 1
    blob = encode_chunk(new, old)
    out = np.empty_like(new)
    with pytest.raises(CodecError, match="truncated"):
        decode_chunk(blob[:-5], old, out)
    with pytest.raises(CodecError, match="not a flywheel"):
        decode_chunk(b"XXXX" + blob[4:], old, out)
    with pytest.raises(CodecError, match="needs its base"):
        decode_chunk(blob, None, out)
    with pytest.raises(CodecError, match="elements"):
        decode_chunk(blob, old[:100], np.empty(100, np.uint16))
    with pytest.raises(CodecError):
        decode_chunk(blob + b"\0", old, out)
    with pytest.raises(TypeError):
        encode_chunk(new.astype(np.float32), None)
    with pytest.raises(ValueError, match="base chunk"):
        encode_chunk(new, old[:10])


# ------------------------------------------------------------------ the sparse format, exactly

from flywheel.weights.codec import MODE_SPARSE, pack_bits, packed_bits_len, unpack_bits  # noqa: E402


def _sections(blob):
    from flywheel.weights.codec import _unpack

    return _unpack(blob)


def test_sparse_chunk_layout_is_the_documented_one():
    old = np.zeros(100, np.uint16)
    new = old.copy()
    new[[0, 5, 40]] = np.array([1, 0xFFFF, 9], np.uint16)  # +1, -1, +9 ulp
    mode, size, k, n, m, sec = _sections(encode_chunk(new, old))
    assert (mode, size, n, m) == (MODE_SPARSE, 2, 100, 3)
    assert k == int(np.log2((100 - 3) / 3 * 0.5)) == 4
    # gaps 0, 4, 34 -> high parts 0, 0, 2; zigzag 2, 1, 18 -> value codes 1, 0, 7 (escape)
    assert list(np.frombuffer(sec[0], np.uint8)) == [0 << 3 | 1, 0 << 3 | 0, 2 << 3 | 7]
    assert list(unpack_bits(np.frombuffer(sec[1], np.uint8), k, 3)) == [0, 4, 34 & 15]
    assert len(sec[2]) == 0  # no gap escapes
    assert list(np.frombuffer(sec[3], np.uint8)) == [18, 0]  # the escaped zigzag code, byte planes


def test_long_gaps_and_big_jumps_escape_and_round_trip():
    old = np.zeros(1 << 20, np.uint16)
    new = old.copy()
    pos = np.r_[np.arange(2000), 600_000, 1_048_575]  # a dense head sets k small; then gaps >> 31 << k
    new[pos] = np.resize(np.array([1, 2, 3, 0x7FFF, 0x8000, 0xFFFF, 0xFFFE, 100, 5, 0x1234], np.uint16), pos.size)
    blob = encode_chunk(new, old)
    mode, _, k, _, m, sec = _sections(blob)
    assert mode == MODE_SPARSE and m == 2002 and k == 8
    assert len(sec[2]) == 2 * 4 and len(sec[3]) > 0  # two uint32 gap escapes; value escapes
    out = np.empty_like(new)
    decode_chunk(blob, old, out)
    assert np.array_equal(out, new)


@settings(max_examples=40, deadline=None)
@given(k=st.integers(0, 32), num=st.integers(0, 300), seed=st.integers(0, 2**31))
def test_pack_bits_round_trip(k, num, seed):
    x = np.random.default_rng(seed).integers(0, 2**32, num, dtype=np.uint64).astype(np.uint32)
    packed = pack_bits(x, k)
    fields = (k // 8) * num + sum(-(-num * w // 8) for w in (4, 2, 1) if k % 8 & w)  # bytes, then 4/2/1-bit fields
    assert packed.dtype == np.uint8 and packed.shape[0] == packed_bits_len(num, k) == fields
    assert packed.shape[0] <= -(-num * k // 8) + 3  # at most a partial byte per field wasted
    expect = x if k == 32 else x & np.uint32((1 << k) - 1)
    assert np.array_equal(unpack_bits(packed, k, num).astype(np.uint32), expect)


def test_first_sparse_format_still_decodes():
    """Chunks written before the packed-low-bits format (mode 1) stay readable."""
    old = ((np.arange(300, dtype=np.uint16) * 7919) % 65521).astype(np.uint16)
    new = old.copy()
    new[[3, 50, 51, 200, 299]] += np.array([1, 0xFFFF, 2, 40, 0x8000], np.uint16)
    blob = bytes.fromhex(
        "46574331010205002c010000000000000500000000000000050000050000000000000000000500000000020000000002"
        "000000010803271f030e00140250ff00ff")
    out = np.empty_like(new)
    decode_chunk(blob, old, out)
    assert np.array_equal(out, new)


def test_corrupt_sparse_sections_are_refused():
    rng = np.random.default_rng(2)
    old = rng.integers(0, 1 << 16, 10_000, dtype=np.uint16)
    new = old.copy()
    new[::50] += np.uint16(1)
    new[::777] += np.uint16(5000)  # some value escapes
    mode, size, k, n, m, sec = _sections(encode_chunk(new, old))
    from flywheel.weights.codec import _pack

    def build(sections, m=m):
        return _pack(mode, size, k, n, m, [(bytes(s), "raw") for s in sections], 3)

    out = np.empty_like(new)
    decode_chunk(build(sec), old, out)
    assert np.array_equal(out, new)
    far = bytearray(sec[0])
    far[-1] = (30 << 3) | (far[-1] & 7)  # last gap jumps past the slice
    with pytest.raises(CodecError, match="do not fit"):
        decode_chunk(build([far, *sec[1:]]), old, out)
    with pytest.raises(CodecError, match="do not fit"):
        decode_chunk(build([*sec[:3], bytes(sec[3])[:-4] + b"\0\0"]), old, out)  # one value escape missing
    with pytest.raises(CodecError, match="partial element"):
        decode_chunk(build([*sec[:3], bytes(sec[3]) + b"\0"]), old, out)
    with pytest.raises(CodecError, match="wrong length"):
        decode_chunk(build([sec[0], bytes(sec[1])[:-1], *sec[2:]]), old, out)


def test_denser_rl_like_deltas_cost_under_a_byte_per_change():
    rng = np.random.default_rng(3)
    old = to_bits(torch.from_numpy(rng.standard_normal(1 << 20).astype(np.float32) * 0.02).bfloat16()).copy()
    for frac, bound in ((0.04, 1.1), (0.10, 0.95)):  # iid positions: entropy ~6.1 / ~4.7 bits + ~1.2 for values
        new = old.copy()
        idx = rng.choice(old.shape[0], int(old.shape[0] * frac), replace=False)
        new[idx] += rng.choice(np.array([1, 0xFFFF, 2, 0xFFFE], np.uint16), idx.shape[0], p=[0.45, 0.45, 0.05, 0.05])
        blob = encode_chunk(new, old)
        assert len(blob) / idx.shape[0] < bound
        out = np.empty_like(new)
        assert np.array_equal(decode_chunk(blob, old, out), new)
