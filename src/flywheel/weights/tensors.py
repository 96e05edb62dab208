"""Tensors <-> raw-bit numpy views, and whole-tensor encode/decode over parallel chunks.

    bits = to_bits(t)                                   # 1-D unsigned view of t's raw bytes (no copy)
    parts = encode_tensor(bits, old_bits, chunk_bytes, level, pool)   # [(blob, start, stop), ...]
    t2 = from_bits(decode_tensor(blobs, old_bits, n, itemsize, chunk_elems, pool), "bfloat16", shape)

Why raw bits: the codec works on the integer view of each dtype, so NaN payloads, -0.0 and
subnormals round-trip exactly and fp8 works wherever torch has it.

The bit-exactness check of manifest format 2 is `tensor_hash`: sha256 over the sha256 digests of the raw
little-endian bytes of each chunk range, in order (a two-level hash tree whose leaves are the chunks). Why not one
sha256 over the whole tensor (format 1, `bits_hash`, still verified when read): a sharded trainer's ranks each hold
a slice, and a flat sha256 can only be computed by streaming every byte through one place; leaf digests are
computed where the bytes are (weights/sharded.py) and give the same hash as an unsharded publish.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor

import numpy as np
import torch

from flywheel.weights.codec import chunk_ranges, decode_chunk, encode_chunk

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SIGNED = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in ("bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
                 "int8", "uint8", "int16", "int32", "int64", "bool")
    if hasattr(torch, name)
}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"tensor dtype {dtype} is not supported by the weight codec; use one of {sorted(DTYPES)}")
    return name


def to_bits(t: torch.Tensor) -> np.ndarray:
    """1-D unsigned numpy view of a CPU tensor's raw bytes (copies only if not contiguous)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    dtype_name(t.dtype)
    t = t.detach().contiguous().reshape(-1)
    if t.device.type != "cpu":
        t = t.cpu()
    size = t.element_size()
    return t.view(_TORCH_INT[size]).numpy().view(_UINT[size])


def from_bits(bits: np.ndarray, dtype: str, shape: Sequence[int]) -> torch.Tensor:
    """The tensor whose raw bytes are `bits` (shares memory)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype '{dtype}' is not one of {sorted(DTYPES)}")
    size = bits.dtype.itemsize
    return torch.from_numpy(bits.view(_SIGNED[size])).view(DTYPES[dtype]).reshape(tuple(shape))


def bits_hash(bits: np.ndarray) -> str:
    """Manifest format 1: sha256 of the whole tensor's raw bytes."""
    return hashlib.sha256(np.ascontiguousarray(bits).data.cast("B")).hexdigest()


def range_digest(bits: np.ndarray) -> bytes:
    """The leaf of `tensor_hash`: sha256 digest of one chunk range's raw bytes."""
    return hashlib.sha256(np.ascontiguousarray(bits).data.cast("B")).digest()


def combine_digests(digests: Sequence[bytes]) -> str:
    return hashlib.sha256(b"".join(digests)).hexdigest()


def tensor_hash(bits: np.ndarray, chunk_elems: int) -> str:
    """Manifest format 2: sha256 over the leaf digests of the `chunk_elems` ranges (see the module docstring)."""
    ranges = chunk_ranges(bits.shape[0], bits.dtype.itemsize, chunk_elems * bits.dtype.itemsize)
    return combine_digests([range_digest(bits[s:e]) for s, e in ranges])


def state_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """One sha256 over a whole state dict: names in sorted order, each with its dtype, shape and `bits_hash`.
    A LoRA adapter's manifest names its base weights by this digest (trainer/lora.py, inference/local.py)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}\0{dtype_name(t.dtype)}\0{list(t.shape)}\0{bits_hash(to_bits(t))}\n".encode())
    return h.hexdigest()


def manifest_hash(bits: np.ndarray, entry: dict, manifest_format: int) -> str:
    """The hash a manifest of `manifest_format` records for a tensor entry with these bits."""
    return bits_hash(bits) if manifest_format == 1 else tensor_hash(bits, int(entry["chunk_elems"]))


def encode_tensor(new: np.ndarray, old: np.ndarray | None, chunk_bytes: int, level: int,
                  pool: Executor | None = None) -> list[bytes]:
    """Encoded chunks of `new` against `old` (or as an anchor), in order."""
    ranges = chunk_ranges(new.shape[0], new.dtype.itemsize, chunk_bytes)

    def one(r: tuple[int, int]) -> bytes:
        return encode_chunk(new[r[0]:r[1]], None if old is None else old[r[0]:r[1]], level)

    return list(pool.map(one, ranges)) if pool is not None and len(ranges) > 1 else [one(r) for r in ranges]


def decode_tensor(blobs: Sequence[bytes], old: np.ndarray | None, num_elements: int, itemsize: int,
                  chunk_elems: int, pool: Executor | None = None) -> np.ndarray:
    """Rebuild a tensor's bits from its chunks (into a new array; `old` is never written)."""
    out = np.empty(num_elements, _UINT[itemsize])
    if old is not None and old.shape != out.shape:
        raise ValueError(f"delta for {num_elements} elements cannot apply to a base of {old.shape[0]}")
    ranges = chunk_ranges(num_elements, itemsize, chunk_elems * itemsize)
    if len(ranges) != len(blobs):
        raise ValueError(f"tensor of {num_elements} elements needs {len(ranges)} chunks, manifest lists {len(blobs)}")

    def one(i: int) -> None:
        s, e = ranges[i]
        decode_chunk(blobs[i], None if old is None else old[s:e], out[s:e])

    if pool is not None and len(ranges) > 1:
        list(pool.map(one, range(len(ranges))))
    else:
        for i in range(len(ranges)):
            one(i)
    return out
