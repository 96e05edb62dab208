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
