"""Fake quantization (modeling/quant.py) against hand-computed values: every e2m1 value, ties, saturation,
zero blocks, NaN/inf, per-block scales, padding, and which weights an engine serves quantized.
The value-for-value comparison with torchao's reference implementations is tests/unit/test_quant_torchao.py."""

import math

import numpy as np
import pytest
import torch

from flywheel.modeling.quant import (
    E2M1_MAX,
    fake_quant,
    fake_quant_fp8,
    fake_quant_mxfp4,
    fake_quant_nvfp4,
    from_storage_codes,
    is_quantized_weight,
    quantize_weights,
    round_to_e2m1,
    storage_codes,
)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_every_e2m1_value_is_kept_and_ties_go_to_the_even_code():
    grid = torch.tensor(E2M1 + [-v for v in E2M1])
    assert torch.equal(round_to_e2m1(grid), grid)
    # midpoints: the even code wins (codes 0=0, 1=0.5, 2=1, 3=1.5, 4=2, 5=3, 6=4, 7=6)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0])
    assert round_to_e2m1(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -2.0, -4.0]
    near = torch.tensor([0.26, 0.74, 2.49, 2.51, 4.99, 5.01])
    assert round_to_e2m1(near).tolist() == [0.5, 0.5, 2.0, 3.0, 4.0, 6.0]
    assert round_to_e2m1(torch.tensor([6.5, 7.0, 1e30, -100.0])).tolist() == [6.0, 6.0, 6.0, -6.0]
    assert math.isnan(round_to_e2m1(torch.tensor([float("nan")])).item())


def test_mxfp4_power_of_two_scale_saturation_and_zero_blocks():
    x = torch.zeros(3, 32)
    x[0, :8] = torch.tensor([6.0, 3.0, 5.0, 0.2, -1.25, 0.0, 4.0, 1.0])  # amax 6: scale 2^(2-2) = 1
    x[1, :3] = torch.tensor([12.0, 5.0, 7.0])  # amax 12: scale 2; 5/2 = 2.5 -> 2 -> 4, 7/2 = 3.5 -> 4 -> 8
    x[2, :2] = torch.tensor([7.0, 0.7])  # amax 7: floor(log2 7) = 2 -> scale 1, so 7 saturates to 6 (OCP FLOOR)
    y = fake_quant_mxfp4(x)
    assert y[0, :8].tolist() == [6.0, 3.0, 4.0, 0.0, -1.0, 0.0, 4.0, 1.0]
    assert y[1, :3].tolist() == [12.0, 4.0, 8.0]
    assert y[2, :2].tolist() == [6.0, 0.5]
    assert torch.equal(y[:, 8:], torch.zeros(3, 24))
    assert torch.equal(fake_quant_mxfp4(torch.zeros(2, 64)), torch.zeros(2, 64))
    tiny = torch.full((1, 32), 3.0 * 2.0**-100)  # far below 1: the scale follows (2^-101)
    assert torch.equal(fake_quant_mxfp4(tiny), tiny)


def test_blocks_are_independent_and_a_non_finite_value_poisons_only_its_scale_group():
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(0))
    x[1, 40] = float("nan")
    x[2, 70] = float("inf")
    for fn, block in ((fake_quant_mxfp4, 32), (lambda t: fake_quant_fp8(t, block_size=32), 32)):
        y = fn(x)
        assert torch.isnan(y[1, 32:64]).all() and torch.isnan(y[2, 64:96]).all()
        bad = torch.zeros_like(x, dtype=torch.bool)
        bad[1, 32:64] = bad[2, 64:96] = True
        assert torch.isfinite(y[~bad]).all()
        assert torch.equal(y[0, :block], fn(x[0:1, :block])[0])  # a block alone = the block among others
    assert torch.isnan(fake_quant_fp8(x)).all()  # per-tensor scale: the whole tensor
    assert torch.isnan(fake_quant_nvfp4(x)).all()  # NVFP4's per-tensor scale too


def test_fp8_per_tensor_rounding_and_saturation_by_hand():
    # amax 448 = e4m3's max: the scale is exactly 1; e4m3 has 3 mantissa bits (step 1/8 on [1, 2))
    x = torch.tensor([448.0, 1.0, 1.0625, 1.1875, 1.2, -3.0, 0.0])
    assert fake_quant_fp8(x).tolist() == [448.0, 1.0, 1.0, 1.25, 1.25, -3.0, 0.0]
    # amax 57344 = e5m2's max: 2 mantissa bits (step 1/4 on [1, 2))
    x = torch.tensor([57344.0, 1.125, 1.375, 1.3])
    assert fake_quant_fp8(x, torch.float8_e5m2).tolist() == [57344.0, 1.0, 1.5, 1.25]
    assert torch.equal(fake_quant_fp8(torch.zeros(5)), torch.zeros(5))
    y = fake_quant_fp8(torch.tensor([896.0, 2.0, 2.125]))  # scale 1/2: 2.125 -> 1.0625 -> 1.0 -> 2.0
    assert y.tolist() == [896.0, 2.0, 2.0]


def test_fp8_block_scales_and_a_last_dim_that_is_not_a_multiple_of_the_block():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, generator=g)
    x[:, 32:] *= 1000  # the partial last block has its own scale
    y = fake_quant_fp8(x, block_size=32)
    for r in range(3):
        assert torch.equal(y[r, :32], fake_quant_fp8(x[r, :32]))
        assert torch.equal(y[r, 32:], fake_quant_fp8(x[r, 32:]))
    padded = torch.nn.functional.pad(x, (0, 24))
    assert torch.equal(fake_quant_mxfp4(x), fake_quant_mxfp4(padded)[:, :40])
    assert torch.equal(fake_quant_nvfp4(x), fake_quant_nvfp4(torch.nn.functional.pad(x, (0, 8)))[:, :40])


def test_nvfp4_two_level_scale_by_hand():
    x = torch.zeros(2, 16)
    x[0, :4] = torch.tensor([6.0, 5.0, -1.25, 0.2])  # the tensor's amax: block scale (6/6)/t = 448, exact in e4m3
    x[1, :2] = torch.tensor([0.75, 0.3])  # block scale (0.75/6)/t = 56: element 0.75/0.125 = 6; 0.3 -> 2.4 -> 2
    y = fake_quant_nvfp4(x)
    assert y[0, :4].tolist() == [6.0, 4.0, -1.0, 0.0]
    assert y[1, :2].tolist() == [0.75, 0.25]
    assert torch.equal(fake_quant_nvfp4(torch.zeros(3, 32)), torch.zeros(3, 32))  # torchao: NaN (0 / 0)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e4m3_block", "fp8_e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_formats_keep_shape_dtype_and_their_error_bound(fmt, dtype):
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = fake_quant(x, fmt)
    assert y.shape == x.shape and y.dtype == dtype
    assert not torch.equal(y, x)
    rel = ((y.float() - x.float()).norm() / x.float().norm()).item()
    bound = {"fp8_e4m3": 0.05, "fp8_e4m3_block": 0.05, "fp8_e5m2": 0.1, "mxfp4": 0.25, "nvfp4": 0.15}[fmt]
    assert 0 < rel < bound
    if fmt in ("mxfp4", "nvfp4"):  # at most 15 distinct values per block (the signed e2m1 grid, one zero)
        block = 32 if fmt == "mxfp4" else 16
        assert max(len(set(b.tolist())) for b in y.float().reshape(-1, block)) <= 15
    assert torch.equal(fake_quant(x, "bf16"), x)
    with pytest.raises(ValueError, match="unknown low-precision format 'fp3'"):
        fake_quant(x, "fp3")


def test_quantize_weights_touches_only_decoder_matrices():
    t = torch.randn(8, 32) * 3
    sd = {"model.embed_tokens.weight": t, "lm_head.weight": t, "model.layers.0.self_attn.q_proj.weight": t,
          "model.layers.0.mlp.gate_proj.weight": t, "model.layers.0.mlp.gate.weight": t,
          "model.layers.0.input_layernorm.weight": t[0], "model.layers.0.self_attn.q_proj.bias": t[0],
          "model.layers.0.mlp.experts.0.down_proj.weight": t}
    out = quantize_weights(sd, "mxfp4")
    changed = {n for n in sd if not torch.equal(out[n], sd[n])}
    assert changed == {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                       "model.layers.0.mlp.experts.0.down_proj.weight"}
    assert torch.equal(out["model.layers.0.self_attn.q_proj.weight"], fake_quant_mxfp4(t))
    assert not is_quantized_weight("model.norm.weight", t[0])
    assert quantize_weights(sd, "bf16") == sd
    assert abs(fake_quant_mxfp4(t)).max() <= E2M1_MAX * 2 ** math.ceil(math.log2(float(t.abs().max())))


def test_storage_codes_decode_to_the_fake_quantized_values():
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(3)) * 5
    grid = torch.tensor(E2M1)
    codes, scales = storage_codes(x, "mxfp4")
    nib = torch.from_numpy(codes)
    nib = torch.stack([nib & 0xF, nib >> 4], -1).reshape(4, 64).long()
    vals = grid[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    scale = 2.0 ** (torch.from_numpy(scales.astype(np.int32)) - 127).float().reshape(4, 2, 1)
    assert torch.equal((vals.reshape(4, 2, 32) * scale).reshape(4, 64), fake_quant_mxfp4(x))
    codes, scales = storage_codes(x, "fp8_e4m3")
    fp8 = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().reshape(4, 64)
    assert codes.dtype == np.uint8 and scales.shape == (1,)
    assert torch.equal(fp8 / float(scales[0]), fake_quant_fp8(x))
    assert storage_codes(x, "nvfp4")[0].nbytes == 4 * 64 // 2 and storage_codes(x, "bf16")[0].dtype == np.uint16


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e4m3_block", "fp8_e5m2", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_stored_codes_give_back_the_fake_quantized_tensor_bit_for_bit(fmt, dtype):
    """weights.publish_served: an engine that receives a format's bytes serves what a fake-quantizing one would."""
    g = torch.Generator().manual_seed(5)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    for shape in [(64, 96), (3, 200), (130, 17), (2, 3, 128)]:  # blocks padded at the end of the last dim, 3-D
        for x in [torch.randn(*shape, generator=g) * 7, torch.zeros(shape), torch.randn(*shape, generator=g) * 1e-30]:
            x = x.to(dtype)
            codes, scales = storage_codes(x, fmt)
            y = from_storage_codes(torch.from_numpy(codes.copy()), torch.from_numpy(scales.copy()), fmt, x.shape, dtype)
            assert y.dtype == dtype and torch.equal(y.view(ints), fake_quant(x, fmt).view(ints)), (shape, x.abs().max())
    with pytest.raises(ValueError, match="scales"):
        from_storage_codes(torch.from_numpy(codes.copy()), None, fmt, x.shape, dtype)


def test_fake_quant_operands_give_torch_scaled_mm_up_to_accumulation_order():
    """torch's real fp8 matmul (per-tensor scales, fp32 accumulate; it runs on CPU too) on the codes and scales of
    fake_quant_fp8 equals F.linear on the fake-quantized operands except for the order of the additions."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(32, 256, generator=g), torch.randn(64, 256, generator=g) * 0.05
    (cx, sx), (cw, sw) = storage_codes(x, "fp8_e4m3"), storage_codes(w, "fp8_e4m3")
    xq = torch.from_numpy(cx).view(torch.float8_e4m3fn).reshape(32, 256)
    wq = torch.from_numpy(cw).view(torch.float8_e4m3fn).reshape(64, 256)
    real = torch._scaled_mm(xq, wq.t(), scale_a=torch.tensor(1 / float(sx[0])), scale_b=torch.tensor(1 / float(sw[0])),
                            out_dtype=torch.float32)
    fake = torch.nn.functional.linear(fake_quant_fp8(x), fake_quant_fp8(w))
    rel = float((real - fake).abs().max() / fake.abs().max())
    assert rel < 1e-5
