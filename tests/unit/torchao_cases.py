"""modeling/quant.py against torchao's reference implementations, value for value. Run by test_quant_torchao.py in a
child pytest with torchao on its path (torchao lives in .venv/torchao, not in the venv: transformers imports it
whenever a model loads, which costs seconds and prints warnings on stderr):
torchao.float8 (per-tensor scaling, e4m3 and e5m2), torchao.prototype.mx_formats (MXFP4 to_mx/to_dtype with
the OCP FLOOR scale; NVFP4 nvfp4_quantize with a per-tensor scale, dequantized as NVFP4Tensor.dequantize does)."""

import warnings

import pytest
import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8
    from torchao.float8.float8_utils import amax_to_scale
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

from flywheel.modeling.quant import fake_quant_fp8, fake_quant_mxfp4, fake_quant_nvfp4

DTYPES = [torch.float32, torch.bfloat16]


def _inputs(dtype, seed):
    """[64, 256] with magnitudes over 12 decades across columns, a zero block, a tiny block and an outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 256)[torch.randperm(256, generator=g)]
    x[3, :32] = 0
    x[5, 32:64] *= 1e-30
    x[7, 100] = 3e7
    return x.to(dtype)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mxfp4_equals_torchao(dtype, seed):
    x = _inputs(dtype, seed)
    scale, data = to_mx(x, torch.float4_e2m1fn_x2, 32)
    assert torch.equal(fake_quant_mxfp4(x), to_dtype(data, scale, torch.float4_e2m1fn_x2, 32, dtype))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_equals_torchao(dtype, seed):
    x = _inputs(dtype, seed)
    per_tensor = per_tensor_amax_to_scale(x.abs().amax())
    block_scale, data = nvfp4_quantize(x, 16, per_tensor)
    elems = f4_unpacked_to_f32(unpack_uint4(data)).view(64, -1, 16)
    ref = (elems * (per_tensor * block_scale.float()).view(64, -1, 1)).view(64, 256).to(dtype)
    assert torch.equal(fake_quant_nvfp4(x), ref)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_per_tensor_and_per_block_equal_torchao(dtype, fp8):
    def ref(t):
        return hp_tensor_and_scale_to_float8(t, amax_to_scale(t.abs().amax(), fp8), fp8).to_original_precision()
    x = _inputs(dtype, 2)
    assert torch.equal(fake_quant_fp8(x, fp8), ref(x))
    blocks = fake_quant_fp8(x, fp8, block_size=128)  # each 1 x 128 block through torchao's per-tensor recipe
    for r in range(0, 64, 9):
        for c in (0, 128):
            assert torch.equal(blocks[r, c:c + 128], ref(x[r, c:c + 128].contiguous()))


def test_nan_agrees_with_torchao_mx():
    x = _inputs(torch.float32, 3)
    x[2, 40] = float("nan")
    scale, data = to_mx(x, torch.float4_e2m1fn_x2, 32)
    ref = to_dtype(data, scale, torch.float4_e2m1fn_x2, 32, torch.float32)
    assert torch.equal(torch.isnan(fake_quant_mxfp4(x)), torch.isnan(ref))
    assert torch.equal(fake_quant_mxfp4(x).nan_to_num(), ref.nan_to_num())
