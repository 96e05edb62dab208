"""Low-precision formats as fake quantization: fp8 (e4m3, e5m2; per-tensor or per-block scales), MXFP4, NVFP4.

    w_q = fake_quant(w, "nvfp4")                      # same dtype and shape as w, every value one NVFP4 can hold
    x_q = fake_quant_fp8(x, torch.float8_e4m3fn, block_size=128)
    quantize_weights(model.state_dict(), "fp8_e4m3")  # {name: tensor} of what an fp8 engine serves
    k_q = fake_quant_kv(k, "nvfp4")                   # the KV cache's rule: each token's head vector alone
    codes, scales = storage_codes(w, "mxfp4")         # the bytes the format stores (packed nibbles, E8M0 scales)
    from_storage_codes(torch.from_numpy(codes), torch.from_numpy(scales), "mxfp4", w.shape, w.dtype)  # == w_q, bitwise

Why fake quant: this machine has no fp8/fp4 matmul units, but the numbers such a kernel multiplies are fixed by
the format's rounding and scaling rules. Quantize-dequantize with those rules (round to nearest even, saturate to
the format's largest finite value) gives the operands exactly; only the accumulation order of the matmul differs
from a GPU kernel's. The arithmetic follows torchao's reference implementations (`torchao.float8`,
`torchao.prototype.mx_formats`): tests/unit/test_quant_torchao.py checks it value for value against them, and
tests/unit/test_quant.py against hand-computed cases and against torch's real fp8 matmul (`torch._scaled_mm`,
which runs on CPU too) on the same codes and scales.

Formats (scales are taken over blocks of the LAST dim, the reduction dim of a Linear weight [out, in] or of an
activation [..., in]; a last dim that is not a multiple of the block gets a zero-padded last block):
- fp8 per tensor: s = fmt_max / amax (computed in float64, stored fp32); q = fp8(clamp(x * s)); x_q = q / s.
- fp8 per block: the same with one s per block (DeepSeek-V3's 1 x 128 activation tiles).
- MXFP4 (OCP MX v1.0): e2m1 elements {0, 0.5, 1, 1.5, 2, 3, 4, 6}, blocks of 32, a shared E8M0 scale
  2^(floor(log2 amax) - 2) (the spec's FLOOR rule: values above 6 * scale saturate to 6 * scale).
- NVFP4: e2m1 elements, blocks of 16, each block scale (amax / 6) / t rounded to fp8 e4m3, times the fp32
  per-tensor scale t = amax_tensor / (448 * 6).
Non-finite inputs: a NaN or inf makes every value that shares its scale NaN (its block; the whole tensor for a
per-tensor scale, which NVFP4 has too), so an overflow upstream is not hidden. (torchao agrees for NaN; for inf
its MX and NVFP4 paths saturate instead.) An all-zero NVFP4 tensor stays zero (torchao's divides 0 by 0: NaN).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

E2M1_MAX = 6.0
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
_F32_MIN_NORMAL = float(torch.finfo(torch.float32).tiny)
_AMAX_EPS = 1e-12  # torchao.float8's floor on amax (no division by zero for an all-zero tensor)
FP8_BLOCK = 128
MX_BLOCK = 32
NV_BLOCK = 16


def _blocks(x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """x as float32 [..., num_blocks, block_size] (the last dim zero-padded to a multiple of the block) and the
    function that takes such a tensor back to x's shape and dtype."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if x.dim() == 0:
        raise ValueError("block scales need a tensor with a last dim; got a scalar")
    shape, n = x.shape, x.shape[-1]
    xf = x.float()
    pad = -n % block_size
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    xb = xf.reshape(*xf.shape[:-1], -1, block_size)

    def back(yb: torch.Tensor) -> torch.Tensor:
        y = yb.reshape(*yb.shape[:-2], -1)[..., :n]
        return y.reshape(shape).to(x.dtype)
    return xb, back


def _nan_where_nonfinite(y: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(amax), y, torch.full_like(y, float("nan")))


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to the nearest e2m1 value (ties to the even code), |x| > 6 saturating to +-6.
    The grid is 0.5 apart on [0, 2], 1 apart on [2, 4], 2 apart on [4, 6]; on each piece an even multiple of
    the step is an even code (0=0.0, 1=0.5, 2=1.0, 3=1.5, 4=2.0, 5=3.0, 6=4.0, 7=6.0), so torch.round's
    half-to-even on x / step is the format's tie rule. NaN stays NaN."""
    a = x.abs().clamp(max=E2M1_MAX)
    step = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, x)


def _fp8_parts(x: torch.Tensor, dtype: torch.dtype, block_size: int | None):
    """(fp8 codes [..., blocks, block], scale s [..., blocks, 1], amax, back): x * s rounded, saturated."""
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise ValueError(f"fp8 dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    fmax = float(torch.finfo(dtype).max)
    if block_size is None:
        xb, back = x.float().reshape(1, -1), lambda y: y.reshape(x.shape).to(x.dtype)
    else:
        xb, back = _blocks(x, block_size)
    amax = xb.abs().amax(-1, keepdim=True)
    scale = (fmax / amax.double().clamp(min=_AMAX_EPS)).float()
    return (xb * scale).clamp(-fmax, fmax).to(dtype), scale, amax, back


def fake_quant_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                   block_size: int | None = None) -> torch.Tensor:
    """x through `dtype` (float8_e4m3fn or float8_e5m2) with a per-tensor scale (block_size None) or one scale
    per `block_size` values of the last dim; torchao.float8's scaling (s = max / amax, saturated cast)."""
    q, scale, amax, back = _fp8_parts(x, dtype, block_size)
    return back(_nan_where_nonfinite(q.float() / scale, amax))


def _mx_parts(x: torch.Tensor, block_size: int):
    """(e2m1 values [..., blocks, block], biased E8M0 exponents [..., blocks, 1], amax, back)."""
    xb, back = _blocks(x, block_size)
    amax = xb.abs().amax(-1, keepdim=True)
    exp = ((amax.view(torch.int32) >> 23) & 0xFF) - 127  # floor(log2 amax) of a normal float32
    biased = (exp - 2).clamp(-127, 128) + 127  # 2 = floor(log2 6): the largest power of two of e2m1
    scale = (biased << 23).view(torch.float32)  # 2^(biased - 127); biased 0 reads as 0.0 here
    return round_to_e2m1(xb / scale.clamp(min=_F32_MIN_NORMAL)), biased, amax, back


def fake_quant_mxfp4(x: torch.Tensor, block_size: int = MX_BLOCK) -> torch.Tensor:
    """x through MXFP4: e2m1 elements, one E8M0 (power-of-two) scale per `block_size` values of the last dim,
    2^(floor(log2 amax) - 2) read off amax's float32 exponent bits (torchao's ScaleCalculationMode.FLOOR). As in
    torchao the elements are divided by max(scale, 2^-126) and multiplied back by the E8M0 scale itself (2^-127
    only for blocks whose amax is below 2^-125)."""
    elems, biased, amax, back = _mx_parts(x, block_size)
    dq = torch.pow(torch.full(biased.shape, 2.0, device=x.device), (biased - 127).float())
    return back(_nan_where_nonfinite(elems * dq, amax))


def _nv_parts(x: torch.Tensor, block_size: int, per_row: bool):
    """(e2m1 values [..., blocks, block], e4m3 block scales [..., blocks, 1], fp32 tensor scale, its amax, back)."""
    xb, back = _blocks(x, block_size)
    amax = xb.abs().amax(-1, keepdim=True)  # [..., num_blocks, 1]
    tensor_amax = amax.amax(-2, keepdim=True) if per_row else amax.amax()
    per_tensor = tensor_amax / (E4M3_MAX * E2M1_MAX)
    block = (amax / E2M1_MAX / per_tensor).clamp(float(torch.finfo(torch.float8_e4m3fn).tiny), E4M3_MAX)
    block = block.to(torch.float8_e4m3fn)
    elems = round_to_e2m1((xb * ((1.0 / per_tensor) / block.float())).clamp(-E2M1_MAX, E2M1_MAX))
    return elems, block, per_tensor, tensor_amax.expand_as(amax), back


def fake_quant_nvfp4(x: torch.Tensor, block_size: int = NV_BLOCK, per_row: bool = False) -> torch.Tensor:
    """x through NVFP4: e2m1 elements, one fp8 e4m3 scale per `block_size` values of the last dim, times the
    fp32 per-tensor scale amax / (448 * 6) (torchao's nvfp4_quantize with per_tensor_scale, dequantize).
    per_row: each last-dim row is its own tensor (its own fp32 scale), as the KV cache quantizes."""
    elems, block, per_tensor, amax, back = _nv_parts(x, block_size, per_row)
    y = torch.where(amax == 0, 0.0, elems * (per_tensor * block.float()))  # all zero: 0 (torchao: 0 / 0 = NaN)
    return back(_nan_where_nonfinite(y, amax))


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """e2m1 values (on the grid) -> their 4-bit codes (sign << 3 | magnitude index), uint8."""
    a = values.abs()
    idx = torch.where(a <= 2.0, a * 2, torch.where(a <= 4.0, a + 2, 7.0)).to(torch.uint8)
    return idx | (torch.signbit(values).to(torch.uint8) << 3)


def storage_codes(x: torch.Tensor, fmt: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The bytes an engine would hold for x in `fmt`: (element codes as unsigned ints, 1-D; the scales as their
    own dtype, 1-D, or None): bf16 bits; fp8 bytes and fp32 scales; MXFP4 nibbles packed two per byte and E8M0
    bytes; NVFP4 nibbles and e4m3 bytes plus the fp32 tensor scale. For sizing deltas (bench/precision.py)."""
    x = x.detach()
    if fmt == "bf16":
        return x.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16).reshape(-1), None
    if fmt in ("fp8_e4m3", "fp8_e4m3_block", "fp8_e5m2"):
        dtype = torch.float8_e5m2 if fmt == "fp8_e5m2" else torch.float8_e4m3fn
        q, scale, _, _ = _fp8_parts(x, dtype, FP8_BLOCK if fmt == "fp8_e4m3_block" else None)
        return q.contiguous().view(torch.uint8).numpy().reshape(-1), scale.numpy().reshape(-1)
    if fmt == "mxfp4":
        elems, biased, _, _ = _mx_parts(x, MX_BLOCK)
        scales = biased.to(torch.uint8).numpy().reshape(-1)
    elif fmt == "nvfp4":
        elems, block, per_tensor, _, _ = _nv_parts(x, NV_BLOCK, False)
        scales = np.concatenate([block.view(torch.uint8).numpy().reshape(-1),
                                 per_tensor.reshape(1).numpy().view(np.uint8)])
    else:
        _check_format(fmt)
        raise AssertionError(f"storage_codes does not cover '{fmt}'")
    codes = e2m1_codes(elems).reshape(-1)
    codes = torch.nn.functional.pad(codes, (0, codes.numel() % 2))
    return (codes[0::2] | (codes[1::2] << 4)).numpy(), scales


_E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
SCALES = "#scales"  # the suffix of a served-form weight's scales in a store (no state-dict name has a '#')


def _e2m1_values(packed: torch.Tensor, count: int) -> torch.Tensor:
    """Packed nibbles (two codes a byte, low first) -> `count` e2m1 values as float32 (code 8 is -0.0)."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(-1)[:count].long()
    return torch.copysign(_E2M1_VALUES[codes & 7], 1.0 - 2.0 * (codes >> 3).float())


def from_storage_codes(codes: torch.Tensor, scales: torch.Tensor | None, fmt: str, shape: tuple[int, ...] | torch.Size,
                       dtype: torch.dtype) -> torch.Tensor:
    """The tensor `storage_codes` stored, of `shape` and `dtype`: bit for bit the `fake_quant(x, fmt)` of the x the
    codes came from (the same dequantizing arithmetic on the same codes and scales), so an engine that receives the
    format's bytes serves exactly the values a fake-quantizing engine would (weights.publish_served). Finite
    inputs only (a non-finite x's NaNs are the quantizer's, not the codes')."""
    shape = tuple(shape)
    n = shape[-1] if shape else 1
    if fmt == "bf16":
        raise ValueError("bf16 has no codes to dequantize: its served form is the tensor itself")
    if scales is None:
        raise ValueError(f"'{fmt}' codes need their scales")
    if fmt in ("fp8_e4m3", "fp8_e4m3_block", "fp8_e5m2"):
        q = codes.view(torch.float8_e5m2 if fmt == "fp8_e5m2" else torch.float8_e4m3fn)
        if fmt != "fp8_e4m3_block":
            return (q.float().reshape(1, -1) / scales.reshape(1, 1)).reshape(shape).to(dtype)
        yb = q.float().reshape(*shape[:-1], -1, FP8_BLOCK) / scales.reshape(*shape[:-1], -1, 1)
        return yb.reshape(*shape[:-1], -1)[..., :n].reshape(shape).to(dtype)
    block = MX_BLOCK if fmt == "mxfp4" else NV_BLOCK if fmt == "nvfp4" else 0
    if not block:
        _check_format(fmt)
        raise AssertionError(f"from_storage_codes does not cover '{fmt}'")
    blocks = shape[:-1] + (-(-n // block), block)
    elems = _e2m1_values(codes, int(np.prod(blocks))).reshape(blocks)
    if fmt == "mxfp4":
        biased = scales.to(torch.int32).reshape(*blocks[:-1], 1)
        yb = elems * torch.pow(torch.full(biased.shape, 2.0), (biased - 127).float())
    else:
        per_tensor = scales[-4:].clone().view(torch.float32).reshape(())
        block_scale = scales[:-4].view(torch.float8_e4m3fn).float().reshape(*blocks[:-1], 1)
        yb = torch.where(per_tensor == 0, 0.0, elems * (per_tensor * block_scale))
    return yb.reshape(*yb.shape[:-2], -1)[..., :n].reshape(shape).to(dtype)


def served_tensors(name: str, t: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """What a weight store publishes for state-dict tensor `name` in the served form of `fmt`: a quantized weight
    (`is_quantized_weight`) as the format's bytes, `{name: codes (uint8, 1-D), name + SCALES: scales (1-D)}`;
    any other tensor as it is. `from_storage_codes` turns the pair back into the served values."""
    if fmt == "bf16" or not is_quantized_weight(name, t):
        return {name: t}
    codes, scales = storage_codes(t, fmt)
    assert scales is not None
    return {name: torch.from_numpy(np.ascontiguousarray(codes)),
            name + SCALES: torch.from_numpy(np.ascontiguousarray(scales))}


def served_tensors_and_values(name: str, t: torch.Tensor, fmt: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(what a store publishes for `name` in the served form of `fmt`, the values an engine then serves): the
    second is dequantized from the first by `from_served_tensors`, the function the engine installs them with, so a
    hash of it is a hash of what the engine computes with (weights/sync.py Publisher's `to_served`)."""
    stored = served_tensors(name, t, fmt)
    return stored, from_served_tensors(stored, fmt, {name: t})[name]


def from_served_tensors(tensors: Mapping[str, torch.Tensor], fmt: str, like: Mapping[str, torch.Tensor]
                        ) -> dict[str, torch.Tensor]:
    """The served-form tensors of a store version (`served_tensors`' output for some state-dict names) back as
    {state-dict name: the values an `fmt` engine serves}, each of the shape and dtype of `like[name]` (the
    engine's own tensor). A quantized weight without its scales, scales without their weight or codes that do
    not fit the weight raise ValueError naming the tensor."""
    out = {}
    for key, t in tensors.items():
        if key.endswith(SCALES):
            if key[:-len(SCALES)] not in tensors:
                raise ValueError(f"served-form update: '{key}' without the codes '{key[:-len(SCALES)]}'")
            continue
        if key not in like:
            out[key] = t  # the engine names what it does not know
            continue
        ref = like[key]
        if is_quantized_weight(key, ref) and fmt != "bf16":
            if key + SCALES not in tensors:
                raise ValueError(f"served-form update: '{key}' is a weight a {fmt} engine serves quantized, and it "
                                 f"came without its scales '{key}{SCALES}'")
            try:
                out[key] = from_storage_codes(t, tensors[key + SCALES], fmt, ref.shape, ref.dtype)
            except (RuntimeError, TypeError) as err:
                raise ValueError(f"served-form update: the {fmt} codes of '{key}' ({t.dtype}, {t.numel()} values) do "
                                 f"not fit its shape {tuple(ref.shape)}: {err}") from None
        else:
            out[key] = t
    return out


# name -> fake quantizer; "bf16" = as given (the dtype the model was loaded in; nothing rounded)
FORMATS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "bf16": lambda x: x,
    "fp8_e4m3": lambda x: fake_quant_fp8(x, torch.float8_e4m3fn),
    "fp8_e4m3_block": lambda x: fake_quant_fp8(x, torch.float8_e4m3fn, FP8_BLOCK),
    "fp8_e5m2": lambda x: fake_quant_fp8(x, torch.float8_e5m2),
    "mxfp4": fake_quant_mxfp4,
    "nvfp4": fake_quant_nvfp4,
}


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown low-precision format '{fmt}'; choose one of {sorted(FORMATS)}")


def fake_quant(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x through the format named `fmt` (a key of FORMATS)."""
    _check_format(fmt)
    return FORMATS[fmt](x)


def fake_quant_kv(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Keys or values [..., head_dim] through `fmt` with every token's head vector its own tensor: fp8 with one
    scale per vector (fp8_e4m3_block: per 128 values of it), MXFP4 / NVFP4 blocks along head_dim (NVFP4's fp32
    scale per vector). A vector's scale never depends on the rest of the batch, so prefill, decode and any
    batching write the same cache."""
    _check_format(fmt)
    if fmt in ("fp8_e4m3", "fp8_e5m2"):
        dtype = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2
        return fake_quant_fp8(x, dtype, block_size=x.shape[-1])
    if fmt == "nvfp4":
        return fake_quant_nvfp4(x, per_row=True)
    return FORMATS[fmt](x)


def is_quantized_weight(name: str, t: torch.Tensor) -> bool:
    """Which weights a low-precision engine serves quantized: the matrices of the decoder layers (attention and
    MLP projections, MoE experts). Embeddings, the LM head, norms, biases and MoE routers (`...mlp.gate.weight`)
    stay as they are, as in vLLM's and TensorRT-LLM's fp8/fp4 checkpoints."""
    return (t.is_floating_point() and t.dim() >= 2 and name.endswith("weight") and "embed" not in name
            and "lm_head" not in name and not name.endswith(".gate.weight"))


def quantize_weight(name: str, t: torch.Tensor, fmt: str) -> torch.Tensor:
    """One state-dict tensor as a `fmt` engine serves it (fake-quantized if `is_quantized_weight`, else t)."""
    return fake_quant(t.detach(), fmt) if fmt != "bf16" and is_quantized_weight(name, t) else t


def quantize_params_(params: Mapping[str, torch.Tensor], fmt: str) -> None:
    """In place: every `is_quantized_weight` parameter's `.data` replaced by its `fmt` fake quantization."""
    for name, t in quantize_weights(params, fmt).items():
        if t is not params[name]:
            params[name].data = t


def quantize_weights(tensors: Mapping[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """{name: tensor} with every `is_quantized_weight` tensor through `fmt` (new tensors) and the rest as given."""
    _check_format(fmt)
    if fmt == "bf16":
        return dict(tensors)
    with torch.no_grad():
        return {n: fake_quant(t.detach(), fmt) if is_quantized_weight(n, t) else t for n, t in tensors.items()}
