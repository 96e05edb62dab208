"""bench/precision.py's pure parts: what each correction does to the per-token weights (hand-computed), and the
delta size of quantized versions. The bench itself runs through `flywheel bench precision` (not a test)."""

import math

import pytest
import torch

from flywheel.bench.precision import corrections, delta_bytes


def test_corrections_against_hand_computed_weights():
    # one trajectory, log-ratios d = log 3, 0, log 0.25 (ratios 3, 1, 0.25); sequence ratio 0.75
    lp_s = torch.tensor([[-2.0, -1.0, -3.0]], dtype=torch.float64)
    lp_t = lp_s + torch.tensor([[math.log(3), 0.0, math.log(0.25)]], dtype=torch.float64)
    mask = torch.ones_like(lp_t, dtype=torch.bool)
    out = corrections(lp_t, lp_s, mask, torch.zeros(1, 3, dtype=torch.long))
    assert out["none"]["weight_error"] == pytest.approx((2 + 0 + 0.75) / 3, rel=1e-6)  # w = 1
    assert out["tis"]["weight_error"] == pytest.approx(1 / 3, rel=1e-6)  # w = min(rho, 2): only token 0 is off
    assert out["icepop"]["weight_error"] == pytest.approx((3 + 0.25) / 3, rel=1e-6)  # tokens 0, 2 masked (w = 0)
    assert out["icepop"]["kept_frac"] == pytest.approx(1 / 3) and out["icepop"]["k3_kept"] == pytest.approx(0.0)
    assert out["mis"]["weight_error"] == pytest.approx(0.0, abs=1e-6)  # sequence ratio 0.75 < 2: exact weight
    assert out["mis"]["kept_frac"] == 1.0 and out["none"]["kept_frac"] == 1.0
    assert out["none"]["max_abs_dlogp_kept"] == pytest.approx(math.log(4), rel=1e-6)


def test_delta_bytes_grow_with_the_change_and_count_changed_scales():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.02
    before = {"model.layers.0.mlp.up_proj.weight": w, "model.embed_tokens.weight": w}
    same = delta_bytes(before, dict(before), "fp8_e4m3")
    assert same["changed_frac"] == 0.0 and same["scale_bytes"] == 0
    moved = w + torch.randn(64, 256, generator=g) * 0.002
    after = {"model.layers.0.mlp.up_proj.weight": moved, "model.embed_tokens.weight": w}
    for fmt in ("bf16", "fp8_e4m3", "fp8_e4m3_block", "mxfp4", "nvfp4"):
        d = delta_bytes(before, after, fmt)
        assert 0 < d["changed_frac"] < 1 and d["delta_bytes"] > same["delta_bytes"], fmt
    assert delta_bytes(before, after, "fp8_e4m3_block")["scale_bytes"] > 0  # block amaxes moved


def test_learning_arms_are_valid_demo_configs_and_a_missing_base_is_one_clear_error(tmp_path):
    """bench/precision_learning.py: every arm's overrides load on configs/demo.toml as the precision they name, and
    a directory without a mid-trained base says what to run first."""
    import pytest

    from flywheel.bench.precision_learning import ARMS, DEMO_CONFIG, learning_arms
    from flywheel.config import load_config
    for name, overrides in ARMS.items():
        cfg = load_config(str(DEMO_CONFIG), overrides)
        assert (cfg.inference.weight_dtype == "fp8_e4m3") == name.startswith("fp8")
        assert (cfg.trainer.matmul_precision == "fp8_tensor") == name.startswith("fp8_both")
        assert cfg.trainer.correction == ("none" if name.endswith("_none") else "tis")
    with pytest.raises(ValueError, match="make demo"):
        learning_arms(tmp_path, tmp_path / "out", [])
